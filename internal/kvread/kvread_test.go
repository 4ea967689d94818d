package kvread_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// A reader that stops reading while the watcher's delivery waits on a full
// Updates (more keys than it holds) leaves no goroutine behind: the
// delivery's, blocked, and Stop's drain both end.
func TestAReaderThatStopsEarlyLeavesNoGoroutine(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "early"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 1000 { // four times what Updates holds
		if _, err := js.PublishAsync(wire.KVSubject("early", "k"+strconv.Itoa(i)), []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()

	for _, stop := range []struct {
		name string
		read func(context.Context, context.CancelFunc) error
	}{
		{"the reader stops", func(ctx context.Context, _ context.CancelFunc) error {
			return kvread.Each(ctx, kv, ">", func(jetstream.KeyValueEntry) bool {
				waitDeliveryBlocked(t) // Updates fills meanwhile
				return false
			})
		}},
		{"its context ends", func(ctx context.Context, cancel context.CancelFunc) error {
			return kvread.Each(ctx, kv, ">", func(jetstream.KeyValueEntry) bool {
				if ctx.Err() == nil { // the entries read after are Each's race with the context's end
					waitDeliveryBlocked(t)
					cancel()
				}
				return true
			})
		}},
	} {
		ctx, cancel := context.WithCancel(ctx)
		err := stop.read(ctx, cancel)
		cancel()
		if !errors.Is(err, kvread.ErrStopped) && !errors.Is(err, context.Canceled) {
			t.Fatalf("%s: Each = %v", stop.name, err)
		}
		natstest.CheckFor(t, 5*time.Second, func() error {
			if n := goroutinesIn("jetstream.(*kvs).WatchFiltered", "kvread.Stop"); n > 0 {
				return fmt.Errorf("%s: %d goroutines of the stopped watcher remain", stop.name, n)
			}
			return nil
		})
	}
}

// waitDeliveryBlocked waits until a KV watcher's delivery is blocked on its
// full Updates: a goroutine of nats.go's watcher callback waits to send.
func waitDeliveryBlocked(t *testing.T) {
	t.Helper()
	natstest.CheckFor(t, 10*time.Second, func() error {
		for g := range bytes.SplitSeq(stacks(), []byte("\n\n")) {
			if bytes.Contains(g, []byte("[chan send")) && bytes.Contains(g, []byte("jetstream.(*kvs).WatchFiltered")) {
				return nil
			}
		}
		return errors.New("no watcher's delivery waits on a full Updates")
	})
}

// stacks returns every goroutine's stack, however long (the embedded
// nats-server's run past a megabyte under -race).
func stacks() []byte {
	for size := 1 << 20; ; size *= 2 {
		buf := make([]byte, size)
		if n := runtime.Stack(buf, true); n < size {
			return buf[:n]
		}
	}
}

// goroutinesIn counts the goroutines whose stack holds any of funcs.
func goroutinesIn(funcs ...string) int {
	n := 0
	for g := range bytes.SplitSeq(stacks(), []byte("\n\n")) {
		for _, f := range funcs {
			if bytes.Contains(g, []byte(f)) {
				n++
				break
			}
		}
	}
	return n
}

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
	"github.com/novox/mesh-provisioner/internal/natstest"
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
		if _, err := js.PublishAsync("$KV.early.k"+strconv.Itoa(i), []byte("v")); err != nil {
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
				time.Sleep(100 * time.Millisecond) // Updates fills meanwhile
				return false
			})
		}},
		{"its context ends", func(ctx context.Context, cancel context.CancelFunc) error {
			return kvread.Each(ctx, kv, ">", func(jetstream.KeyValueEntry) bool {
				time.Sleep(100 * time.Millisecond)
				cancel()
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

// goroutinesIn counts the goroutines whose stack holds any of funcs.
func goroutinesIn(funcs ...string) int {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	n := 0
	for g := range bytes.SplitSeq(buf, []byte("\n\n")) {
		for _, f := range funcs {
			if bytes.Contains(g, []byte(f)) {
				n++
				break
			}
		}
	}
	return n
}

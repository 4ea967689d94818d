package service

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/natstest"
)

// Applies that ask at once share STREAM.INFO requests, and each is given a
// revision at least that of every write acknowledged before it asked.
func TestLastRevisionsShareRequestsAndAreNeverOlderThanTheAsking(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "lastrev"})
	if err != nil {
		t.Fatal(err)
	}
	var infos atomic.Int64
	watch := natstest.Connect(t, s)
	if _, err := watch.Subscribe("$JS.API.STREAM.INFO.KV_lastrev", func(*nats.Msg) { infos.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	last := &lastRevisions{kv: kv, base: ctx}

	const askers = 64
	var wg sync.WaitGroup
	for i := range askers {
		wg.Go(func() {
			acked, err := kv.Put(ctx, "k", []byte{byte(i)})
			if err != nil {
				t.Error(err)
				return
			}
			got, err := last.get(ctx)
			if err != nil {
				t.Error(err)
				return
			}
			if got < acked {
				t.Errorf("asked after revision %d was acknowledged, got revision %d", acked, got)
			}
		})
	}
	wg.Wait()
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := infos.Load(); n == 0 || n >= askers {
		t.Errorf("%d STREAM.INFO requests for %d askers, want fewer, and some", n, askers)
	}
	t.Logf("%d STREAM.INFO requests for %d askers", infos.Load(), askers)
}

package service

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/natstest"
)

// A node's applies that ask at once share the reads of its newest write,
// and each is given a revision at least that of every write of the node
// acknowledged before it asked.
func TestLastWritesShareReadsAndAreNeverOlderThanTheAsking(t *testing.T) {
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
	var reads atomic.Int64
	watch := natstest.Connect(t, s)
	if _, err := watch.Subscribe("$JS.API.DIRECT.GET.KV_lastrev", func(*nats.Msg) { reads.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := watch.Flush(); err != nil {
		t.Fatal(err)
	}
	store := &writeStore{js: js}
	last := newLastWrites(ctx, func(ctx context.Context, prefix string) (uint64, error) {
		return store.lastUnder(ctx, "lastrev", prefix)
	})

	const askers = 64
	var wg sync.WaitGroup
	for i := range askers {
		wg.Go(func() {
			acked, err := kv.Put(ctx, fmt.Sprintf("ace.m%d", i%8), []byte{byte(i)})
			if err != nil {
				t.Error(err)
				return
			}
			got, err := last.get(ctx, "ace.")
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
	if n := reads.Load(); n == 0 || n >= askers {
		t.Errorf("%d direct gets for %d askers, want fewer, and some", n, askers)
	}
	t.Logf("%d direct gets for %d askers", reads.Load(), askers)
	// The senders end once no one waits: nothing of the node is kept.
	natstest.CheckFor(t, 5*time.Second, func() error {
		last.mu.Lock()
		defer last.mu.Unlock()
		if len(last.next) != 0 || len(last.sending) != 0 {
			return fmt.Errorf("after the askers, %d rounds and %d senders are remembered, want none", len(last.next), len(last.sending))
		}
		return nil
	})
}

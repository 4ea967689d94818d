package mirror

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
)

// noConsumers is a bucket's stream on which no consumer can be made while
// refuse is set, as while JetStream's meta leader is being elected; its
// direct gets are answered all along, as any replica answers them.
type noConsumers struct {
	jetstream.Stream
	refuse  *atomic.Bool
	refused atomic.Int64
}

func (s *noConsumers) CreateConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	if s.refuse.Load() {
		s.refused.Add(1)
		return nil, errors.New("no consumer can be made: the meta leader is being elected")
	}
	return s.Stream.CreateConsumer(ctx, cfg)
}

// While its consumer is lost and none can be made, a copy that is behind
// reads the bucket's changes by direct get (pollWhileBehind): puts and
// deletes reach it, and it still says it is behind, until a consumer is
// made again and catches up.
func TestACopyBehindPollsByDirectGet(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(t.Context(), js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(t.Context(), keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(t.Context(), "a.web.port.http", need(t)); err != nil {
		t.Fatal(err)
	}
	m := New()
	w, err := m.Open(t.Context(), js, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	var refuse atomic.Bool
	var stream *noConsumers
	for _, f := range w.followers {
		if f.copy.Bucket() == keys.NeedsBucket {
			stream = &noConsumers{Stream: f.stream, refuse: &refuse}
			f.stream = stream
		}
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); w.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	select {
	case <-m.Needs.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the copy did not load")
	}

	// The consumer is lost, and no other can be made.
	refuse.Store(true)
	for name := range stream.ConsumerNames(t.Context()).Name() {
		if err := stream.DeleteConsumer(t.Context(), name); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if !m.Needs.Behind() {
			return errors.New("the copy does not say it is behind after its consumer was deleted")
		}
		return nil
	})
	if _, err := kv.Put(t.Context(), "b.web.port.http", need(t)); err != nil {
		t.Fatal(err)
	}
	if err := kv.Delete(t.Context(), "a.web.port.http"); err != nil {
		t.Fatal(err)
	}
	last, err := kv.Put(t.Context(), "c.web.port.http", need(t))
	if err != nil {
		t.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer wcancel()
	if !m.Needs.WaitFor(wctx, last) {
		t.Fatalf("with no consumer, the copy is at revision %d, not %d, after 5s", m.Needs.Revision(), last)
	}
	all, _ := m.Needs.All()
	if got, want := keysOf(all), []string{"b.web.port.http", "c.web.port.http"}; !slices.Equal(got, want) {
		t.Errorf("keys read by direct get %v, want %v", got, want)
	}
	if !m.Needs.Behind() {
		t.Error("the copy says it caught up while no consumer could be made")
	}
	// The watcher asks for a consumer again after a wait of its own: it
	// may not have asked yet when direct gets brought the changes.
	natstest.CheckFor(t, 5*time.Second, func() error {
		if stream.refused.Load() == 0 {
			return errors.New("no consumer was asked for: the test proves nothing")
		}
		return nil
	})

	// A consumer can be made again: it catches up, and the copy is current.
	refuse.Store(false)
	natstest.CheckFor(t, 5*time.Second, func() error {
		if m.Needs.Behind() {
			return errors.New("the copy is still behind once a consumer can be made")
		}
		return nil
	})
}

package mirror

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// A purge of a bucket, which no consumer delivers, is noticed: the copy says
// it is behind, reads every key again and holds what the bucket holds.
func TestWatcherNoticesAPurge(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(t.Context(), js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	// The state buckets refuse purges; this one is made again without, to
	// see a purge noticed.
	natstest.MakePurgeable(t.Context(), t, js, "KV_"+keys.NeedsBucket)
	kv, err := js.KeyValue(t.Context(), keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"ace.web.port.http", "ace.web.port.admin", "bob.web.port.http"} {
		if _, err := kv.Put(t.Context(), key, need(t)); err != nil {
			t.Fatal(err)
		}
	}
	m := New()
	w, err := m.Open(t.Context(), js, nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go w.Run(ctx)
	count := func() int { all, _ := m.Needs.All(); return len(all) }
	waitUntil := func(what string, ok func() bool) {
		t.Helper()
		natstest.CheckFor(t, 5*time.Second, func() error {
			if !ok() {
				return fmt.Errorf("%s: the copy holds %d keys, behind %v", what, count(), m.Needs.Behind())
			}
			return nil
		})
	}
	waitUntil("loaded", func() bool { return m.Needs.Ready() && count() == 3 })
	natstest.Purge(t.Context(), t, js, "KV_"+keys.NeedsBucket, jetstream.WithPurgeSubject(wire.KVSubject(keys.NeedsBucket, "ace.>")))
	purged := time.Now()
	sawBehind := false
	waitUntil("the purge noticed", func() bool {
		sawBehind = sawBehind || m.Needs.Behind()
		return count() == 1 && !m.Needs.Behind()
	})
	t.Logf("the copy held what the purged bucket holds %s after the purge; said behind meanwhile: %v", time.Since(purged).Round(time.Millisecond), sawBehind)
	if !sawBehind {
		t.Error("the copy never said it was behind")
	}
	// A whole purge, with nothing written after it.
	natstest.Purge(t.Context(), t, js, "KV_"+keys.NeedsBucket)
	waitUntil("the whole purge noticed", func() bool { return count() == 0 && !m.Needs.Behind() })
}

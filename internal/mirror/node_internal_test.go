package mirror

import (
	"context"
	"sync"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/natstest"
)

// A provider's bucket read for one node claims a revision at least as new
// as every key it read, as the copy does: keys written between the
// bucket's state and the watcher of the node's keys are read, and newer
// than that state.
func TestReadBoundClaimsEveryKeyItRead(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	writing, stop := context.WithCancel(ctx)
	var wrote sync.WaitGroup
	wrote.Go(func() {
		for writing.Err() == nil {
			_, _ = kv.Put(writing, "ace.web.db", []byte("bound"))
		}
	})
	defer func() { stop(); wrote.Wait() }()

	for i := range 200 {
		revision, keys, err := readBound(ctx, js, "pg_bound", "ace", 0)
		if err != nil {
			t.Fatal(err)
		}
		for key, rev := range keys {
			if rev > revision {
				t.Fatalf("read %d: key %s at revision %d, above the bucket's revision %d claimed", i, key, rev, revision)
			}
		}
	}
}

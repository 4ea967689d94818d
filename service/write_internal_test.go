package service

import (
	"fmt"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
)

// An apply that does not know its module's last write reads it from the
// bucket: the revision of the newest write of any of the module's keys,
// whether the bucket stores its keys as written or by partition.
func TestLastOfModuleIsItsNewestWrite(t *testing.T) {
	t.Parallel()
	for _, layout := range []buckets.Config{{}, {Partitions: 8}} {
		t.Run(fmt.Sprintf("stored by %d partitions", layout.Partitions), func(t *testing.T) {
			t.Parallel()
			ctx := t.Context()
			js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
			if err != nil {
				t.Fatal(err)
			}
			if err := buckets.Ensure(ctx, js, layout); err != nil {
				t.Fatal(err)
			}
			store, err := openWriteStore(ctx, js, mirror.New())
			if err != nil {
				t.Fatal(err)
			}
			b := store.buckets[keys.NeedsBucket]
			for _, key := range []string{"ace.web.port.http", "ace.api.port.http", "ace.web.port.admin", "bob.web.port.http", "ace.webby.port.x"} {
				if _, err := b.kv.Put(ctx, key, nil); err != nil {
					t.Fatal(err)
				}
			}
			for _, tc := range []struct {
				node, module string
				want         uint64
			}{
				{"ace", "web", 3}, {"ace", "api", 2}, {"bob", "web", 4}, {"ace", "webby", 5}, {"ace", "none", 0}, {"cat", "web", 0},
			} {
				if got, err := store.lastOfModule(ctx, b, tc.node, tc.module); err != nil || got != tc.want {
					t.Errorf("the last write of %s's %s: %d, %v; want %d", tc.node, tc.module, got, err, tc.want)
				}
			}
		})
	}
}

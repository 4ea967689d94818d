package mirror_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// A node read alone (ReadNode, for an answer while the copy loads) is read
// as the whole copy holds it, at its buckets' last revisions, while
// nats-server's JetStream API answers stream infos and consumers later
// than a read waits (as it does while instances load a large mesh): its
// keys come from direct gets, which the server answers at once. ace has
// keys of its own in two buckets (one deleted, one its name alone) and
// none in the third, whose read says the revision all the same; wide has
// more keys than one batch direct get returns, and heavy more bytes than
// one is let bring: both are read through a watcher.
func TestANodeIsReadAlonePastASlowJetStreamAPI(t *testing.T) {
	t.Parallel()
	forEachLayout(t, func(t *testing.T, layout buckets.Config) {
		ctx := t.Context()
		nc, direct := bucketsOn(t, layout)
		need, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
		puts := map[string][]string{
			keys.NeedsBucket:   {"ace.web.port.http", "ace.web.port.admin", "ace.db.port.pg", "ace", "bob.web.port.http"},
			keys.AppliedBucket: {"ace.web", "bob.web"},
			keys.CollectBucket: {"bob.web.routes.r1"},
		}
		for bucket, names := range puts {
			kv, err := direct.KeyValue(ctx, bucket)
			if err != nil {
				t.Fatal(err)
			}
			for _, key := range names {
				if _, err := kv.Put(ctx, key, need); err != nil {
					t.Fatal(err)
				}
			}
			if bucket == keys.NeedsBucket {
				if err := kv.Delete(ctx, "ace.web.port.admin"); err != nil {
					t.Fatal(err)
				}
				for i := range 1100 {
					if _, err := kv.Put(ctx, fmt.Sprintf("wide.web.port.p%d", i), need); err != nil {
						t.Fatal(err)
					}
				}
				large := make([]byte, 60_000)
				for i := range 150 {
					if _, err := kv.Put(ctx, fmt.Sprintf("heavy.web.port.p%d", i), large); err != nil {
						t.Fatal(err)
					}
				}
			}
		}

		slow, slowing := slowJetStreamAPI(t, nc, 3*time.Second, "STREAM.INFO.", "CONSUMER.CREATE.")
		m := mirror.New()
		w, err := m.Open(ctx, slow, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		runWatchers(t, w)
		waitLoaded(t, m.Needs, m.Applied, m.Collect, m.Registry, m.Manifests)

		wide, err := w.ReadNode(ctx, "wide")
		if err != nil {
			t.Fatalf("read wide alone: %v", err)
		}
		if entries, _, _ := wide.Needs.Group("wide"); len(entries) != 1100 {
			t.Errorf("wide read alone: %d needs, want 1100", len(entries))
		}
		heavy, err := w.ReadNode(ctx, "heavy")
		if err != nil {
			t.Fatalf("read heavy alone: %v", err)
		}
		if entries, _, _ := heavy.Needs.Group("heavy"); len(entries) != 150 {
			t.Errorf("heavy, 9 MB of values, read alone: %d needs, want 150", len(entries))
		}

		slowing.Store(true)
		readCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		read, err := w.ReadNode(readCtx, "ace")
		if err != nil {
			t.Fatalf("read ace alone with the API 3s late: %v", err)
		}
		readAsWhole(t, direct, m.Needs, read.Needs, "ace")
		readAsWhole(t, direct, m.Applied, read.Applied, "ace")
		readAsWhole(t, direct, m.Collect, read.Collect, "ace")
	})
}

// readAsWhole checks that alone holds node's keys as whole does, each
// with its revision, at its bucket's last revision.
func readAsWhole[R proto.Message](t *testing.T, js jetstream.JetStream, whole, alone *mirror.Copy[R], node string) {
	t.Helper()
	keysOf := func(c *mirror.Copy[R]) []string {
		entries, _, _ := c.Group(node)
		out := []string{}
		for _, e := range entries {
			out = append(out, e.Key)
		}
		return out
	}
	if diff := cmp.Diff(keysOf(whole), keysOf(alone)); diff != "" {
		t.Errorf("%s's keys of %s read alone, against the whole copy's (-whole +alone):\n%s", node, whole.Bucket(), diff)
	}
	if _, wholeAt, _ := whole.Group(node); true {
		if _, aloneAt, _ := alone.Group(node); aloneAt != wholeAt {
			t.Errorf("%s's last change in %s read alone at revision %d, the whole copy's at %d", node, whole.Bucket(), aloneAt, wholeAt)
		}
	}
	stream, err := js.Stream(t.Context(), wire.StreamOf(whole.Bucket()))
	if err != nil {
		t.Fatal(err)
	}
	if last := stream.CachedInfo().State.LastSeq; alone.Revision() != last {
		t.Errorf("%s read alone at revision %d, want the bucket's last, %d", whole.Bucket(), alone.Revision(), last)
	}
}

// waitLoaded waits for each copy's initial values.
func waitLoaded(t *testing.T, copies ...mirror.Watched) {
	t.Helper()
	for _, c := range copies {
		select {
		case <-c.Loaded():
		case <-time.After(30 * time.Second):
			t.Fatalf("the copy of %s did not load within 30s", c.Bucket())
		}
	}
}

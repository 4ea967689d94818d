package mirror_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// A copy that holds some nodes takes in their keys alone, loaded or
// followed, in every state bucket, and its revision is the bucket's still:
// a request that asks for a revision written of another node is not held
// up. The manifests are held whole.
func TestSetHoldsKeepsTheNodesHeldAlone(t *testing.T) {
	t.Parallel()
	forEachLayout(t, func(t *testing.T, layout buckets.Config) {
		ctx := t.Context()
		_, js := bucketsOn(t, layout)
		put := func(bucket, key string, value proto.Message) uint64 {
			t.Helper()
			kv, err := js.KeyValue(ctx, bucket)
			if err != nil {
				t.Fatal(err)
			}
			data, _ := proto.Marshal(value)
			rev, err := kv.Put(ctx, key, data)
			if err != nil {
				t.Fatal(err)
			}
			return rev
		}
		each := func(node string) {
			put(keys.NeedsBucket, node+".web.port.http", &provisionerv1.Need{Placeholder: "${port:http}"})
			put(keys.AppliedBucket, node+".web", &provisionerv1.Applied{})
			put(keys.CollectBucket, node+".motd.web", &provisionerv1.CollectItem{Value: "hi"})
			put(keys.ManifestsBucket, node+".pg", &provisionerv1.Manifest{})
		}
		each("ace")
		each("bob")
		needsRev := put(keys.NeedsBucket, "bob.web.port.last", &provisionerv1.Need{Placeholder: "${port:last}"})

		m := mirror.New()
		m.SetHolds(heldOf("ace"))
		logger, reads := recordReads()
		w, err := m.Open(ctx, js, logger)
		if err != nil {
			t.Fatal(err)
		}
		runWatchers(t, w)
		natstest.CheckFor(t, 10*time.Second, func() error {
			if !m.Ready() {
				return fmt.Errorf("loading %v", m.Loading())
			}
			return nil
		})
		held := func(stage string) {
			t.Helper()
			for _, c := range []mirror.Watched{m.Needs, m.Applied, m.Collect} {
				if st, _ := c.Stamp("ace"); st == 0 {
					t.Errorf("%s: %s: ace's keys are not held", stage, c.Bucket())
				}
				if st, _ := c.Stamp("bob"); st != 0 {
					t.Errorf("%s: %s: bob's keys are held", stage, c.Bucket())
				}
				if _, _, groups, _ := c.Counts(); groups != 1 {
					t.Errorf("%s: %s holds %d nodes, want 1", stage, c.Bucket(), groups)
				}
			}
			if _, _, groups, _ := m.Manifests.Counts(); groups != 2 {
				t.Errorf("%s: the manifests hold %d nodes, want both", stage, groups)
			}
		}
		held("loaded")
		// Read by partition, the needs' read delivers ace's key alone, and
		// the copy is at the bucket's last revision all the same: bob's.
		want := []int{3}
		if layout.Partitions > 0 {
			want = []int{1}
		}
		if diff := cmp.Diff(want, reads(keys.NeedsBucket)); diff != "" {
			t.Errorf("messages of the needs' full reads (-want +got):\n%s", diff)
		}
		if got := m.Needs.Revision(); got != needsRev {
			t.Errorf("the copy of needs loaded at revision %d, want the bucket's last, %d", got, needsRev)
		}

		// Followed: bob's write moves the copy's revision, and holds nothing.
		rev := put(keys.NeedsBucket, "bob.api.port.http", &provisionerv1.Need{Placeholder: "${port:http}"})
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if !m.Needs.WaitFor(waitCtx, rev) {
			t.Fatalf("the copy of needs did not reach bob's write's revision %d (at %d)", rev, m.Needs.Revision())
		}
		held("followed")
	})
}

// A copy told to hold other nodes while it is followed reads their keys
// whole, the last value of each and none deleted, drops the keys of the
// nodes it no longer holds, and goes on following the bucket.
func TestHoldChangesTheNodesHeldWhileFollowed(t *testing.T) {
	t.Parallel()
	forEachLayout(t, func(t *testing.T, layout buckets.Config) {
		ctx := t.Context()
		_, js := bucketsOn(t, layout)
		kv, err := js.KeyValue(ctx, keys.NeedsBucket)
		if err != nil {
			t.Fatal(err)
		}
		put := func(key, placeholder string) uint64 {
			t.Helper()
			data, _ := proto.Marshal(&provisionerv1.Need{Placeholder: placeholder})
			rev, err := kv.Put(ctx, key, data)
			if err != nil {
				t.Fatal(err)
			}
			return rev
		}
		put("ace.web.port.http", "${port:http}")
		put("bob.web.port.http", "${port:old}")
		put("bob.web.port.http", "${port:http}")
		put("bob.web.port.gone", "${port:gone}")
		if err := kv.Delete(ctx, "bob.web.port.gone"); err != nil {
			t.Fatal(err)
		}

		m := mirror.New()
		m.SetHolds(heldOf("ace"))
		w, err := m.Open(ctx, js, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		runWatchers(t, w)
		natstest.CheckFor(t, 10*time.Second, func() error {
			if !m.Ready() {
				return fmt.Errorf("loading %v", m.Loading())
			}
			return nil
		})
		placeholders := func(node string) []string {
			var out []string
			entries, _, _ := m.Needs.Group(node)
			for _, e := range entries {
				out = append(out, e.Key+"="+e.Record.GetNeed().GetPlaceholder())
			}
			return out
		}
		wait := func(held <-chan struct{}) {
			t.Helper()
			select {
			case <-held:
			case <-time.After(10 * time.Second):
				t.Fatal("the copy did not hold the nodes asked within 10s")
			}
		}
		if got := placeholders("bob"); len(got) != 0 {
			t.Fatalf("bob is held before Hold: %v", got)
		}

		wait(w.Hold(heldOf("ace", "bob")))
		if diff := cmp.Diff([]string{"bob.web.port.http=${port:http}"}, placeholders("bob")); diff != "" {
			t.Errorf("bob's keys once held (-want +got):\n%s", diff)
		}
		if diff := cmp.Diff([]string{"ace.web.port.http=${port:http}"}, placeholders("ace")); diff != "" {
			t.Errorf("ace's keys once bob is held too (-want +got):\n%s", diff)
		}
		rev := put("bob.api.port.http", "${port:api}")
		waitCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if !m.Needs.WaitFor(waitCtx, rev) {
			t.Fatalf("the copy did not follow bob's write at %d", rev)
		}
		if got := placeholders("bob"); len(got) != 2 {
			t.Errorf("bob's keys after his write: %v, want two", got)
		}

		wait(w.Hold(heldOf("bob")))
		if got := placeholders("ace"); len(got) != 0 {
			t.Errorf("ace's keys still held: %v", got)
		}
		if _, _, groups, _ := m.Applied.Counts(); groups != 0 {
			t.Errorf("the copy of applied records holds %d nodes, want none", groups)
		}
		if got := placeholders("bob"); len(got) != 2 {
			t.Errorf("bob's keys after ace is let go: %v, want two", got)
		}
	})
}

// A node held anew while it is written and deleted: its keys read by the
// Hold and the changes the watcher applies meanwhile end as the bucket
// has them, none older over a newer, none deleted back.
func TestHoldReadsBesideTheWatcher(t *testing.T) {
	t.Parallel()
	forEachLayout(t, func(t *testing.T, layout buckets.Config) {
		ctx := t.Context()
		_, js := bucketsOn(t, layout)
		kv, err := js.KeyValue(ctx, keys.NeedsBucket)
		if err != nil {
			t.Fatal(err)
		}
		const keyCount = 300
		put := func(i, version int) uint64 {
			t.Helper()
			data, _ := proto.Marshal(&provisionerv1.Need{Placeholder: fmt.Sprintf("${port:v%d}", version)})
			rev, err := kv.Put(ctx, fmt.Sprintf("bob.web.port.k%d", i), data)
			if err != nil {
				t.Fatal(err)
			}
			return rev
		}
		// Many keys of ace's, before bob's, so that the read comes to bob's
		// while they are being changed.
		var wg sync.WaitGroup
		for w := range 8 {
			wg.Go(func() {
				for i := range 2000 {
					data, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:x}"})
					if _, err := kv.Put(ctx, fmt.Sprintf("ace.m%d.port.k%d", w, i), data); err != nil {
						t.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		for i := range keyCount {
			put(i, 0)
		}

		m := mirror.New()
		m.SetHolds(heldOf("ace"))
		w, err := m.Open(ctx, js, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		runWatchers(t, w)
		natstest.CheckFor(t, 20*time.Second, func() error {
			if !m.Ready() {
				return fmt.Errorf("loading %v", m.Loading())
			}
			return nil
		})

		// Bob's keys change while the Hold reads them: each one put again,
		// or deleted.
		writing, stopWriting := context.WithCancel(ctx)
		var last atomic.Uint64
		var writes sync.WaitGroup
		writes.Go(func() {
			for n := 1; writing.Err() == nil; n++ {
				i := n * 7 % keyCount
				if n%3 == 0 {
					if err := kv.Delete(ctx, fmt.Sprintf("bob.web.port.k%d", i)); err != nil {
						t.Error(err)
						return
					}
					continue // the next put's revision is later
				}
				last.Store(put(i, n))
			}
		})
		held := w.Hold(heldOf("ace", "bob"))
		select {
		case <-held:
		case <-time.After(20 * time.Second):
			t.Fatal("the Hold did not read bob's keys within 20s")
		}
		time.Sleep(50 * time.Millisecond) // writes after the read too: the watcher's
		stopWriting()
		writes.Wait()
		last.Store(put(keyCount, 0)) // after every write and delete
		waitCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if !m.Needs.WaitFor(waitCtx, last.Load()) {
			t.Fatalf("the copy did not reach revision %d", last.Load())
		}

		// The bucket's keys as stored, read with the stored subjects.
		stored := wire.StoredKeys{Bucket: keys.NeedsBucket, Partitions: layout.Partitions}
		want := map[string]string{}
		entries, err := kvread.LiveOf(ctx, kv, stored.NodeKeys("bob"))
		if err != nil {
			t.Fatal(err)
		}
		for _, e := range entries {
			n := &provisionerv1.Need{}
			if err := proto.Unmarshal(e.Value(), n); err != nil {
				t.Fatal(err)
			}
			want[stored.KeyOfStored(e.Key())] = n.GetPlaceholder()
		}
		got := map[string]string{}
		copied, _, _ := m.Needs.Group("bob")
		for _, e := range copied {
			got[e.Key] = e.Record.GetNeed().GetPlaceholder()
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("bob's keys in the copy against the bucket's (-want +got):\n%s", diff)
		}
		if len(want) <= 1 || len(want) > keyCount {
			t.Errorf("the bucket holds %d of bob's %d keys: the writes deleted none, or all", len(want), keyCount)
		}
	})
}

// meshPartitions is how many partitions the tests' meshes have: ace's and
// bob's differ.
const meshPartitions = 8

// heldOf returns the partitions of nodes, as the service holds them.
func heldOf(nodes ...string) []bool {
	held := make([]bool, meshPartitions)
	for _, node := range nodes {
		held[wire.PartitionOf(node, meshPartitions)] = true
	}
	return held
}

// forEachLayout runs test on buckets that store keys as written, and by
// partition: of the mesh's count, and of a multiple of it (read by
// partitions all the same).
func forEachLayout(t *testing.T, test func(t *testing.T, layout buckets.Config)) {
	for _, partitions := range []int{0, meshPartitions, 2 * meshPartitions} {
		t.Run(fmt.Sprintf("stored by %d partitions", partitions), func(t *testing.T) {
			t.Parallel()
			test(t, buckets.Config{Partitions: partitions})
		})
	}
}

// recordReads returns a logger that records the full reads the watchers
// log, and the count of messages of each of a bucket's reads.
func recordReads() (*slog.Logger, func(bucket string) []int) {
	var mu sync.Mutex
	var out bytes.Buffer
	logger := slog.New(slog.NewJSONHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return out.Write(p)
	}), &slog.HandlerOptions{Level: slog.LevelDebug}))
	return logger, func(bucket string) []int {
		mu.Lock()
		defer mu.Unlock()
		var counts []int
		for line := range strings.Lines(out.String()) {
			var rec struct {
				Msg, Bucket string
				Messages    int
			}
			if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "read every key's last value" && rec.Bucket == bucket {
				counts = append(counts, rec.Messages)
			}
		}
		return counts
	}
}

type writerFunc func(p []byte) (int, error)

func (w writerFunc) Write(p []byte) (int, error) { return w(p) }

// bucketsOn starts a nats-server of the test's own, and returns a
// connection to it and its JetStream, the mesh's buckets made in layout.
func bucketsOn(t *testing.T, layout buckets.Config) (*nats.Conn, jetstream.JetStream) {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(t.Context(), js, layout); err != nil {
		t.Fatal(err)
	}
	return nc, js
}

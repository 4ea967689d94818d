package mirror

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/natstest"
	"github.com/novox/mesh-provisioner/keys"
)

func keysOf[R proto.Message](entries []*Entry[R]) []string {
	out := make([]string, len(entries))
	for i, e := range entries {
		out[i] = e.Key
	}
	return out
}

func need(t *testing.T) []byte {
	t.Helper()
	b, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCopyKeepsKeyOrder(t *testing.T) {
	t.Parallel()
	c := New().Needs
	// "a" alone is out of shape, and sorts between group a-b and group a.
	for i, key := range []string{"a.web.port.http", "a-b.web.port.http", "a", "b.db.dir.x", "a.api.port.http"} {
		c.Apply(key, need(t), uint64(i+1), false)
	}
	all, revision := c.All()
	want := []string{"a", "a-b.web.port.http", "a.api.port.http", "a.web.port.http", "b.db.dir.x"}
	if diff := cmp.Diff(want, keysOf(all)); diff != "" || revision != 5 {
		t.Errorf("All() at revision %d (-want +got):\n%s", revision, diff)
	}
	if all[0].Malformed == nil || all[1].Malformed != nil {
		t.Errorf("a lone token should be malformed, a full key not: %v %v", all[0].Malformed, all[1].Malformed)
	}
	group, changedAt, _ := c.Group("a")
	if diff := cmp.Diff([]string{"a", "a.api.port.http", "a.web.port.http"}, keysOf(group)); diff != "" || changedAt != 5 {
		t.Errorf("Group(a) changed at %d (-want +got):\n%s", changedAt, diff)
	}

	// A delete leaves the group, which remembers when it changed.
	c.Apply("a.web.port.http", nil, 6, true)
	group, changedAt, _ = c.Group("a")
	if diff := cmp.Diff([]string{"a", "a.api.port.http"}, keysOf(group)); diff != "" || changedAt != 6 {
		t.Errorf("after a delete, Group(a) changed at %d (-want +got):\n%s", changedAt, diff)
	}
	if _, ok := c.Get("a", "a.web.port.http"); ok {
		t.Error("a deleted key is still held")
	}
	if all, _ := c.All(); len(all) != 4 {
		t.Errorf("All() after a delete holds %d keys, want 4", len(all))
	}
}

// GroupOnce decodes a group's view for the reader alone; Group keeps it for
// the next reads, GroupOnce's too.
func TestGroupOnceKeepsNoView(t *testing.T) {
	t.Parallel()
	c := New().Needs
	for i, key := range []string{"a.web.port.http", "a.web.port.admin", "b.db.dir.x"} {
		c.Apply(key, need(t), uint64(i+1), false)
	}
	first, _, _ := c.GroupOnce("a")
	again, changedAt, revision := c.GroupOnce("a")
	if diff := cmp.Diff([]string{"a.web.port.admin", "a.web.port.http"}, keysOf(again)); diff != "" || changedAt != 2 || revision != 3 {
		t.Errorf("GroupOnce(a) changed at %d, revision %d (-want +got):\n%s", changedAt, revision, diff)
	}
	if first[0] == again[0] {
		t.Error("GroupOnce kept the view it decoded")
	}
	kept, _, _ := c.Group("a")
	if once, _, _ := c.GroupOnce("a"); once[0] != kept[0] {
		t.Error("GroupOnce decoded again a view Group kept")
	}
}

func TestWaitFor(t *testing.T) {
	t.Parallel()
	c := New().Applied
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if c.WaitFor(ctx, 1) {
		t.Fatal("WaitFor(1) of an empty copy returned true")
	}
	done := make(chan bool)
	go func() { done <- c.WaitFor(t.Context(), 2) }()
	c.Apply("ace.web", nil, 1, false)
	c.Apply("ace.db", nil, 2, false)
	if !<-done {
		t.Error("WaitFor(2) did not see revision 2")
	}
}

// A watcher started again drops the keys deleted while none ran.
func TestWatchersStartedAgainDropDeletedKeys(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
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
	for _, key := range []string{"ace.web.port.http", "ace.web.port.admin", "novox.web.port.http"} {
		if _, err := kv.Put(t.Context(), key, need(t)); err != nil {
			t.Fatal(err)
		}
	}
	m := New()
	// watch runs a watcher until the copy reaches revision, or for 5s.
	watch := func(revision uint64) {
		t.Helper()
		w, err := m.Open(t.Context(), js, nil)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan struct{})
		go func() { defer close(done); w.Run(ctx) }()
		wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
		m.Needs.WaitFor(wctx, revision)
		wcancel()
		cancel()
		<-done
	}
	watch(3)
	if all, _ := m.Needs.All(); len(all) != 3 {
		t.Fatalf("first watcher loaded %d keys, want 3", len(all))
	}

	// One key deleted and one written again while no watcher runs.
	if err := kv.Delete(t.Context(), "ace.web.port.admin"); err != nil {
		t.Fatal(err)
	}
	last, err := kv.Put(t.Context(), "novox.web.port.http", need(t))
	if err != nil {
		t.Fatal(err)
	}
	watch(last)
	if diff := cmp.Diff([]string{"ace.web.port.http", "novox.web.port.http"}, func() []string { all, _ := m.Needs.All(); return keysOf(all) }()); diff != "" {
		t.Errorf("after the second watcher (-want +got):\n%s", diff)
	}
}

// A group holds the same keys in the same order whatever order they come
// in, before and after its copy is loaded: out of order while loading (a
// tail merged in now and then), in place after.
func TestCopyKeepsKeyOrderInAnyArrivalOrder(t *testing.T) {
	t.Parallel()
	rng := rand.New(rand.NewPCG(7, 23))
	c := New().Needs
	want := map[string]uint64{}
	check := func(when string) {
		t.Helper()
		entries, _, _ := c.Group("n")
		var keys []string
		for key := range want {
			keys = append(keys, key)
		}
		slices.Sort(keys)
		if diff := cmp.Diff(keys, keysOf(entries)); diff != "" {
			t.Fatalf("%s: keys differ (-want +got):\n%s", when, diff)
		}
		for _, e := range entries {
			if e.Record.GetRevision() != want[e.Key] || e.Record.GetName() == "" {
				t.Fatalf("%s: %s holds %v, want revision %d", when, e.Key, e.Record, want[e.Key])
			}
		}
	}
	revision := uint64(0)
	step := func() {
		key := fmt.Sprintf("n.m%d.port.p%d", rng.IntN(5), rng.IntN(80))
		revision++
		if rng.IntN(5) == 0 {
			c.Apply(key, nil, revision, true)
			delete(want, key)
			return
		}
		c.Apply(key, need(t), revision, false)
		want[key] = revision
	}
	for i := range 1000 {
		step()
		if i%97 == 0 {
			check(fmt.Sprintf("loading, change %d", i))
		}
	}
	c.MarkLoaded()
	check("loaded")
	for i := range 500 {
		step()
		if i%13 == 0 {
			check(fmt.Sprintf("loaded, change %d", i))
		}
	}
	check("at the end")
}

package mirror

import (
	"context"
	"fmt"
	"iter"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
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

// A view made after a change reuses the entries of the values the stale
// view decoded and the copy still holds, and decodes the others.
func TestViewAfterAChangeDecodesOnlyWhatChanged(t *testing.T) {
	t.Parallel()
	c := New().Needs
	put := func(key, placeholder string, revision uint64) {
		t.Helper()
		value, err := proto.Marshal(&provisionerv1.Need{Placeholder: placeholder})
		if err != nil {
			t.Fatal(err)
		}
		c.Apply(key, value, revision, false)
	}
	byKey := func(view []*Entry[*provisionerv1.NeedRecord]) map[string]*Entry[*provisionerv1.NeedRecord] {
		m := map[string]*Entry[*provisionerv1.NeedRecord]{}
		for _, e := range view {
			m[e.Key] = e
		}
		return m
	}
	for i, key := range []string{"a.api.port.http", "a.web.port.admin", "a.web.port.http", "a.zz"} {
		put(key, "${port:"+key+"}", uint64(i+1))
	}
	before, _, _ := c.Group("a")

	put("a.web.port.http", "${port:changed}", 5)
	c.Apply("a.web.port.admin", nil, 6, true)
	// Written over at a revision it had: a bucket deleted and made again
	// counts its revisions from 1.
	put("a.api.port.http", "${port:made again}", 1)
	after, _, _ := c.Group("a")
	if diff := cmp.Diff([]string{"a.api.port.http", "a.web.port.http", "a.zz"}, keysOf(after)); diff != "" {
		t.Fatalf("Group(a) after the changes (-want +got):\n%s", diff)
	}
	old, now := byKey(before), byKey(after)
	for key, placeholder := range map[string]string{"a.web.port.http": "${port:changed}", "a.api.port.http": "${port:made again}"} {
		if now[key] == old[key] || now[key].Record.GetNeed().GetPlaceholder() != placeholder {
			t.Errorf("%s: got %v, want a new entry of %s", key, now[key].Record, placeholder)
		}
	}
	if now["a.zz"] != old["a.zz"] {
		t.Error("a.zz is malformed and unchanged: its entry should be the one listed before")
	}

	// Only the value changed since is decoded: GroupOnce too reuses what
	// the stale view decoded, and leaves it for the next read.
	put("a.web.port.http", "${port:again}", 7)
	once, _, _ := c.GroupOnce("a")
	kept, _, _ := c.Group("a")
	if once[0] != now["a.api.port.http"] || kept[0] != once[0] {
		t.Error("a.api.port.http is unchanged: GroupOnce and then Group should reuse its entry")
	}
	if once[1] == kept[1] || kept[1].Record.GetNeed().GetPlaceholder() != "${port:again}" {
		t.Errorf("a.web.port.http changed: GroupOnce's entry %p and Group's %p should both be new, of ${port:again}", once[1], kept[1])
	}
}

// However a node writes between reads, the values decoded together that a
// view keeps alive through the entries it reuses are at most twice its own.
func TestViewsKeepAtMostTwiceTheirValuesAlive(t *testing.T) {
	t.Parallel()
	c := New().Needs
	const n = 10
	key := func(i int) string { return fmt.Sprintf("a.web.port.p%d", i) }
	revision := uint64(0)
	// An entry's read is the read that decoded it, with every entry new to
	// that read: decoded together, kept alive together.
	readOf := map[*Entry[*provisionerv1.NeedRecord]]int{}
	decoded := map[int]int{}
	read := func(i int) []*Entry[*provisionerv1.NeedRecord] {
		view, _, _ := c.Group("a")
		for _, e := range view {
			if _, ok := readOf[e]; !ok {
				readOf[e] = i
				decoded[i]++
			}
		}
		return view
	}
	for i := range n {
		revision++
		c.Apply(key(i), need(t), revision, false)
	}
	read(0)
	for round := 1; round < 3*n; round++ {
		// Keys round and after written again: each view could reuse one
		// entry decoded by each read before, and keep all they decoded.
		for i := round % n; i < n; i++ {
			revision++
			c.Apply(key(i), need(t), revision, false)
		}
		view := read(round)
		alive, reads := 0, map[int]bool{}
		for _, e := range view {
			if r := readOf[e]; !reads[r] {
				reads[r] = true
				alive += decoded[r]
			}
		}
		if alive > 2*len(view) {
			t.Fatalf("round %d: a view of %d values keeps %d decoded alive, by %d reads", round, len(view), alive, len(reads))
		}
	}
}

// Reads made while a node is written, with views reused, kept and dropped
// by a small bound, each see the node's values at one revision: run with
// -race, as make test does.
func TestViewsReusedUnderConcurrentReadsAndWrites(t *testing.T) {
	t.Parallel()
	c := New().Needs
	c.views.limit = 8 // views dropped while they are read and reused
	const n = 8
	key := func(i int) string { return fmt.Sprintf("a.web.port.p%d", i) }
	put := func(i int, revision uint64) {
		value, err := proto.Marshal(&provisionerv1.Need{Placeholder: fmt.Sprint(revision)})
		if err != nil {
			panic(err)
		}
		c.Apply(key(i), value, revision, false)
	}
	revision := uint64(0)
	for i := range n {
		revision++
		put(i, revision)
	}
	c.MarkLoaded()
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for r := range 4 {
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				read := c.Group
				if r%2 == 1 {
					read = c.GroupOnce
				}
				view, _, _ := read("a")
				if len(view) != n {
					t.Errorf("a read saw %d values, want %d", len(view), n)
					return
				}
				for _, e := range view {
					if got := e.Record.GetNeed().GetPlaceholder(); got != fmt.Sprint(e.Record.GetRevision()) {
						t.Errorf("%s at revision %d decodes as %s", e.Key, e.Record.GetRevision(), got)
						return
					}
				}
			}
		})
	}
	for range 2000 {
		revision++
		put(int(revision)%n, revision)
	}
	close(stop)
	wg.Wait()
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

// After lists what All lists after a key, in the same order, for every key
// and between keys, across groups whose tokens prefix one another and
// lone tokens (malformed needs, and a registry's every key).
func TestAfterListsAsAllDoes(t *testing.T) {
	t.Parallel()
	needs := New().Needs
	for i, key := range []string{"a.web.port.http", "a-b.web.port.http", "a", "a-b", "a=c.x.port.y", "a/b.x.port.y",
		"b.db.dir.x", "a.api.port.http", "a-", "a-.x.port.y", "b", "0.x.port.y", "a.web.port.https"} {
		needs.Apply(key, need(t), uint64(i+1), false)
	}
	registry := New().Registry
	for i, kind := range []string{"port", "port-range", "secret", "a"} {
		registry.Apply(kind, []byte{}, uint64(i+1), false)
	}
	checkAfter(t, needs.All, needs.After)
	checkAfter(t, registry.All, registry.After)
}

func checkAfter[R proto.Message](t *testing.T, all func() ([]*Entry[R], uint64), after func(string) iter.Seq[*Entry[R]]) {
	t.Helper()
	every, _ := all()
	afters := []string{"", "~"}
	for _, e := range every {
		afters = append(afters, e.Key, e.Key+".", e.Key+"-", e.Key[:len(e.Key)-1])
	}
	for _, from := range afters {
		var want []string
		for _, e := range every {
			if e.Key > from {
				want = append(want, e.Key)
			}
		}
		var got []string
		for e := range after(from) {
			got = append(got, e.Key)
		}
		if diff := cmp.Diff(want, got); diff != "" {
			t.Errorf("After(%q) (-All's +After's):\n%s", from, diff)
		}
	}
}

// TestChangedReadsItsLogAsAWalkWould applies random puts and deletes to a
// loaded copy, past the log's limit, and asks Changed from random earlier
// generations: the log's answer (and the walk's, for a generation from
// before the log) must be the groups whose last change is later and that
// still hold something.
func TestChangedReadsItsLogAsAWalkWould(t *testing.T) {
	t.Parallel()
	c := New().Needs
	value := need(t)
	rng := rand.New(rand.NewPCG(7, 7))
	key := func() string {
		return fmt.Sprintf("n%d.web.port.p%d", rng.IntN(50), rng.IntN(3))
	}
	lastChange := map[string]uint64{} // the generation of each group's last change
	revision, gen := uint64(0), uint64(0)
	apply := func(deleted bool) {
		revision++
		k := key()
		c.Apply(k, value, revision, deleted)
		first, _, _ := strings.Cut(k, ".")
		if _, now := c.Changed(^uint64(0)); now != gen { // a delete of nothing changes nothing
			gen, lastChange[first] = now, now
		}
	}
	for range 100 { // loading: not logged
		apply(false)
	}
	c.MarkLoaded()
	var gens []uint64
	for step := range 3 * changesLimit {
		apply(rng.IntN(3) == 0)
		gens = append(gens, gen)
		if step%97 != 0 {
			continue
		}
		since := gens[rng.IntN(len(gens))]
		if rng.IntN(5) == 0 {
			since = 0 // from before the log: a walk
		}
		var want []string
		for first, at := range lastChange {
			if st, _ := c.Stamp(first); at > since && st != 0 {
				want = append(want, first)
			}
		}
		got, now := c.Changed(since)
		slices.Sort(want)
		slices.Sort(got)
		if diff := cmp.Diff(want, got); diff != "" || now != gen {
			t.Fatalf("step %d: Changed(%d) at generation %d (-want +got):\n%s", step, since, now, diff)
		}
	}
}

// BenchmarkChanged asks, of a copy of 100,000 nodes, which changed since
// the last look, after one node's change: from the change log, and by
// walking every group as a reader from before the log does.
func BenchmarkChanged(b *testing.B) {
	c := New().Needs
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		b.Fatal(err)
	}
	const nodes = 100_000
	revision := uint64(0)
	for n := range nodes {
		revision++
		c.Apply(fmt.Sprintf("n%d.web.port.http", n), value, revision, false)
	}
	c.MarkLoaded()
	for _, from := range []string{"log", "walk"} {
		b.Run(from, func(b *testing.B) {
			i := 0
			for b.Loop() {
				_, mark := c.Changed(^uint64(0))
				revision++
				c.Apply(fmt.Sprintf("n%d.web.port.http", i%nodes), value, revision, false)
				if from == "walk" { // the log starts after the change
					c.mu.Lock()
					c.changes, c.changesFrom = c.changes[:0], c.gen
					c.mu.Unlock()
				}
				if firsts, _ := c.Changed(mark); len(firsts) != 1 {
					b.Fatalf("%d changed, want 1", len(firsts))
				}
				i++
			}
		})
	}
}

// Every change of a copy tells Mirror.Moved, also those that move no
// revision: a key applied below the copy's revision (a bucket made again)
// and keys dropped by keepOnly.
func TestEveryChangeTellsMoved(t *testing.T) {
	t.Parallel()
	m := New()
	c := m.Needs
	value := need(t)
	told := func() bool {
		select {
		case <-m.Moved():
			return true
		default:
			return false
		}
	}
	c.Apply("a.web.port.http", value, 10, false)
	c.Apply("a.web.port.admin", value, 11, false)
	c.MarkLoaded()
	told()
	for _, step := range []struct {
		name   string
		change func()
	}{
		{"a put", func() { c.Apply("b.web.port.http", value, 12, false) }},
		{"a put below the copy's revision", func() { c.Apply("a.web.port.old", value, 5, false) }},
		{"a key dropped by keepOnly", func() {
			c.keepOnly(map[string]bool{"a.web.port.http": true, "b.web.port.http": true, "a.web.port.old": true}, nil)
		}},
	} {
		step.change()
		if !told() {
			t.Errorf("%s did not tell Moved", step.name)
		}
	}
	if told() {
		t.Error("Moved told with nothing changed")
	}
}

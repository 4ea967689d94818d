package mirror

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
)

// Deletes of held, listed and refused keys, and of keys never written,
// keep the budget's counts exact, and a node that leaves leaves no group.
func TestBudgetCountsDeletesExactly(t *testing.T) {
	t.Parallel()
	c := New().Needs
	c.SetBudget(Budget{Keys: 2}, func(Excess) {})
	const written = 2 + maxListedOverBudget + 48
	key := func(i int) string { return fmt.Sprintf("ace.web.port.p%03d", i) }
	rev := uint64(0)
	apply := func(k string, deleted bool) {
		rev++
		c.Apply(k, need(t), rev, deleted)
	}
	for i := range written {
		apply(key(i), false)
	}
	c.Apply("bob.web.port.http", need(t), 1000, false)
	check := func(what string, held, refused int) {
		t.Helper()
		x := excessOf(c.OverBudget(), "ace")
		if x.Keys != held || x.Refused != refused {
			t.Errorf("%s: ace holds %d keys with %d refused, want %d with %d", what, x.Keys, x.Refused, held, refused)
		}
	}
	check("written", 2, written-2)
	apply(key(written-1), true) // refused, not listed
	check("a refused key deleted", 2, written-3)
	apply(key(written-1), true) // again
	check("a refused key deleted twice", 2, written-3)
	apply(key(10), true) // listed
	check("a listed key deleted", 2, written-4)
	apply("ace.web.port.never", true)
	check("a key never written deleted", 2, written-4)
	apply(key(0), true) // held
	check("a held key deleted", 1, written-4)
	if got := c.takeReadmits(); len(got) != 1 || got[0] != "ace" {
		t.Errorf("after a held key's delete, the nodes to read again are %v, want [ace]", got)
	}
	for i := range written {
		apply(key(i), true)
	}
	if x := c.OverBudget(); len(x) != 0 {
		t.Errorf("every key of ace deleted, the copy still reports %v", x)
	}
	c.mu.RLock()
	_, kept := c.groups["ace"]
	groups := len(c.groups)
	c.mu.RUnlock()
	if kept || groups != 1 {
		t.Errorf("every key of ace deleted: its group kept %v, %d groups (want bob's alone)", kept, groups)
	}
	if st, _ := c.Stamp("ace"); st != 0 {
		t.Errorf("the stamp of a node that left is %d, want 0", st)
	}
}

// A node over its budget that the copy no longer holds leaves the report
// without being said to be back within its budget, and is not read again.
func TestANodeLetGoOverItsBudgetIsNotBackWithinIt(t *testing.T) {
	t.Parallel()
	c := New().Needs
	var heard []Excess
	c.SetBudget(Budget{Keys: 1}, func(x Excess) { heard = append(heard, x) })
	c.Apply("ace.web.port.a", need(t), 1, false)
	c.Apply("ace.web.port.b", need(t), 2, false) // over: not held
	c.Apply("ace.web.port.a", need(t), 3, true)  // room again: ace waits to be read again
	c.Apply("ace.web.port.c", need(t), 4, false) // over again
	if x := excessOf(c.OverBudget(), "ace"); !x.Over {
		t.Fatalf("ace over its budget is reported as %+v", x)
	}
	heard = nil
	c.setHolds(func(first string) bool { return first != "ace" })
	c.dropUnheld()
	if x := c.OverBudget(); len(x) != 0 {
		t.Errorf("ace let go, the copy still reports %v over budget", x)
	}
	if len(heard) != 0 {
		t.Errorf("ace let go, the budget's listener heard %+v, want nothing", heard)
	}
	if got := c.takeReadmits(); len(got) != 0 {
		t.Errorf("ace let go, the nodes to read again are %v, want none", got)
	}
}

func excessOf(x []Excess, node string) Excess {
	for _, e := range x {
		if e.Node == node {
			return e
		}
	}
	return Excess{}
}

// A node back under its budget has its keys not held read again and held,
// as many as fit.
func TestBudgetReadmitsKeysWhenRoomIsMade(t *testing.T) {
	t.Parallel()
	for _, layout := range []buckets.Config{{}, {Partitions: 8}} {
		t.Run(fmt.Sprintf("stored by %d partitions", layout.Partitions), func(t *testing.T) {
			t.Parallel()
			nc := natstest.Connect(t, natstest.Start(t))
			js, err := jetstream.New(nc)
			if err != nil {
				t.Fatal(err)
			}
			if err := buckets.Ensure(t.Context(), js, layout); err != nil {
				t.Fatal(err)
			}
			kv, err := js.KeyValue(t.Context(), keys.NeedsBucket)
			if err != nil {
				t.Fatal(err)
			}
			const budget, written = 3, 110 // some listed, some refused unlisted
			key := func(i int) string { return fmt.Sprintf("ace.web.port.p%03d", i) }
			for i := range written {
				if _, err := kv.Put(t.Context(), key(i), need(t)); err != nil {
					t.Fatal(err)
				}
			}
			m := New()
			m.Needs.SetBudget(Budget{Keys: budget}, func(Excess) {})
			w, err := m.Open(t.Context(), js, nil)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			go w.Run(ctx)
			held := func() []string {
				entries, _, _ := m.Needs.Group("ace")
				var out []string
				for _, e := range entries {
					if !e.overBudget {
						out = append(out, e.Key)
					}
				}
				return out
			}
			waitFor := func(what string, ok func() bool) {
				t.Helper()
				natstest.CheckFor(t, 5*time.Second, func() error {
					if !ok() {
						return fmt.Errorf("%s: held %v, over budget %+v", what, held(), m.Needs.OverBudget())
					}
					return nil
				})
			}
			waitFor("loaded", func() bool { return m.Needs.Ready() && len(held()) == budget })
			if x := excessOf(m.Needs.OverBudget(), "ace"); x.Refused != written-budget {
				t.Fatalf("loaded: %+v, want %d refused", x, written-budget)
			}
			// Two held keys and one refused unlisted key deleted: two keys are
			// admitted again, from those not held, and the counts stay exact.
			deleted := append(held()[:2:2], key(written-1))
			for _, k := range deleted {
				if err := kv.Delete(t.Context(), k); err != nil {
					t.Fatal(err)
				}
			}
			waitFor("room made", func() bool {
				x := excessOf(m.Needs.OverBudget(), "ace")
				return len(held()) == budget && x.Refused == written-budget-len(deleted)
			})
			for _, k := range held() {
				for _, d := range deleted {
					if k == d {
						t.Errorf("deleted key %s is held", k)
					}
				}
				if _, ok := m.Needs.Get("ace", k); !ok {
					t.Errorf("held key %s has no record", k)
				}
			}
			t.Logf("held after the deletes: %v", held())
		})
	}
}

// The copy's counts, kept as it changes, are what a full read counts:
// through puts, malformed keys, a node over its budget, deletes and the
// keys a new watcher no longer finds.
func TestCountsAreAFullReadsCounts(t *testing.T) {
	t.Parallel()
	c := New().Needs
	c.SetBudget(Budget{Keys: 3}, func(Excess) {})
	check := func(what string) {
		t.Helper()
		entries, revision := c.All()
		records, malformed, groups := 0, 0, map[string]bool{}
		for _, e := range entries {
			if e.Malformed != nil {
				malformed++
			} else {
				records++
			}
			first, _, _ := strings.Cut(e.Key, ".")
			groups[first] = true
		}
		r, m, g, rev := c.Counts()
		if r != records || m != malformed || g != len(groups) || rev != revision {
			t.Errorf("%s: counts %d records, %d malformed, %d groups at %d; a full read %d, %d, %d at %d",
				what, r, m, g, rev, records, malformed, len(groups), revision)
		}
	}
	rev := uint64(0)
	apply := func(k string, deleted bool) {
		rev++
		c.Apply(k, need(t), rev, deleted)
	}
	check("empty")
	for i := range 5 + maxListedOverBudget {
		apply(fmt.Sprintf("ace.web.port.p%03d", i), false) // 3 held, the rest listed then refused
	}
	apply("bob.web.port.http", false)
	apply("bob.web.port", false) // out of shape
	check("written")
	apply("bob.web.port.http", false) // written again
	apply("ace.web.port.p001", true)  // held
	apply("ace.web.port.p050", true)  // listed
	apply("bob.web.port", true)
	check("some deleted")
	live := map[string]bool{"ace.web.port.p000": true, "ace.web.port.p002": true}
	c.keepOnly(live, nil)
	check("only two keys live")
	apply("ace.web.port.p000", true)
	apply("ace.web.port.p002", true)
	check("all deleted")
	if r, m, g, _ := c.Counts(); r+m+g != 0 {
		t.Errorf("every key deleted, the copy counts %d records, %d malformed, %d groups", r, m, g)
	}
}

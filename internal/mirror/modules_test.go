package mirror

import (
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// A reader of one module's needs finds them by the key's prefix, decoded
// in its scratch or read from the view kept, with no other module's; it
// hears every key's revision without decoding, and the keys held
// otherwise apart.
func TestOneModulesNeeds(t *testing.T) {
	t.Parallel()
	c := New().Needs
	for i, key := range []string{"a.web.port.http", "a.web-x.port.http", "a.web.dir.state", "a.db.port.pg", "a.web.port.bad name", "b.web.port.http"} {
		c.Apply(key, need(t), uint64(i+1), false)
	}
	var scratch Scratch[*provisionerv1.NeedRecord]
	ranges := []struct {
		prefixes []string
		want     []string
	}{
		{[]string{"a.web."}, []string{"a.web.dir.state", "a.web.port.http"}},
		{[]string{"a.db.", "a.web."}, []string{"a.db.port.pg", "a.web.dir.state", "a.web.port.http"}},
		{[]string{"a.db.", "a.web-x.", "a.web."}, []string{"a.db.port.pg", "a.web-x.port.http", "a.web.dir.state", "a.web.port.http"}},
		{[]string{"a.cache.", "a.web-x."}, []string{"a.web-x.port.http"}},
		{nil, []string{}},
	}
	for _, read := range []string{"decoded", "from the view"} {
		if read == "from the view" {
			c.Group("a") // a view kept: read, not decoded
		}
		for _, tt := range ranges {
			if diff := cmp.Diff(tt.want, keysOf(c.RangesInto("a", tt.prefixes, &scratch))); diff != "" {
				t.Errorf("RangesInto(a, %q), %s (-want +got):\n%s", tt.prefixes, read, diff)
			}
		}
	}
	got := c.RangesInto("a", []string{"a.db.", "a.web."}, &scratch)
	if got[1].Record.GetModule() != "web" || got[1].Record.GetKind() != "dir" {
		t.Errorf("RangesInto's second record: %v", got[1].Record)
	}
	if none := c.RangesInto("c", []string{"c.web."}, &scratch); len(none) != 0 {
		t.Errorf("RangesInto of a node without needs: %v", keysOf(none))
	}

	var heard []string
	var revisions []uint64
	c.KeyRevisions("a", func(key string, revision uint64) {
		heard, revisions = append(heard, key), append(revisions, revision)
	})
	if diff := cmp.Diff([]string{"a.db.port.pg", "a.web-x.port.http", "a.web.dir.state", "a.web.port.http"}, heard); diff != "" {
		t.Errorf("KeyRevisions(a) (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff([]uint64{4, 2, 3, 1}, revisions); diff != "" {
		t.Errorf("KeyRevisions(a)'s revisions (-want +got):\n%s", diff)
	}
	odd := c.Odd("a")
	if len(odd) != 1 || odd[0].Key != "a.web.port.bad name" || odd[0].Malformed == nil {
		t.Errorf("Odd(a) = %v, want the key with a space, malformed", keysOf(odd))
	}
}

// Spans tells each module's needs apart by the key's second token, with
// their revisions and whether one is of a kind asked, as a walk of every
// key would: tokens that start alike ("a", "a-b", "a.") sort around each
// other, and a copy still loading holds keys out of order.
func TestSpans(t *testing.T) {
	t.Parallel()
	tokens := []string{"a", "a-b", "a-", "ab", "a_", "a/b", "b", "-"}
	for _, loaded := range []bool{false, true} {
		rng := rand.New(rand.NewPCG(1, uint64(len(tokens))))
		for round := range 50 {
			c := New().Needs
			for i := range 1 + rng.IntN(80) {
				key := "n." + tokens[rng.IntN(len(tokens))] + "." + tokens[rng.IntN(len(tokens))] + "." + tokens[rng.IntN(len(tokens))]
				c.Apply(key, need(t), uint64(1+rng.IntN(1000)), false)
				if i == 40 && loaded {
					c.MarkLoaded()
				}
			}
			c.Apply("m.a.a.a", need(t), 5, false) // another node's
			var thirds []string
			for _, token := range tokens {
				if rng.IntN(3) == 0 {
					thirds = append(thirds, token)
				}
			}
			slices.Sort(thirds)

			// What a walk of every key makes of them.
			var want []Span
			c.KeyRevisions("n", func(key string, revision uint64) {
				tok := strings.Split(key, ".")
				if len(want) == 0 || want[len(want)-1].Second != tok[1] {
					want = append(want, Span{Second: tok[1]})
				}
				s := &want[len(want)-1]
				s.Keys++
				s.Newest = max(s.Newest, revision)
				s.Total += revision
				s.OfThirds = s.OfThirds || slices.Contains(thirds, tok[2])
			})
			var got []Span
			c.Spans("n", thirds, func(s Span) { got = append(got, s) })
			if diff := cmp.Diff(want, got); diff != "" {
				t.Fatalf("round %d (loaded %v), thirds %q: Spans(n) (-want +got):\n%s", round, loaded, thirds, diff)
			}
		}
	}
	var none []Span
	New().Needs.Spans("n", nil, func(s Span) { none = append(none, s) })
	if len(none) != 0 {
		t.Errorf("Spans of a node without keys: %v", none)
	}
}

package instance

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/novox/mesh-provisioner/service"
)

// A member serves what is dealt to it, and keeps what it serves until the
// member it is dealt to serves it.
func TestTargetKeepsWhatItServesUntilItsMemberServesIt(t *testing.T) {
	t.Parallel()
	const n = 16
	members := []string{"ace", "bob"}
	aces, bobs := shareOf("ace", members, n), shareOf("bob", members, n)
	if len(aces) == 0 || len(bobs) == 0 || len(aces)+len(bobs) != n {
		t.Fatalf("16 partitions dealt to two as %v and %v", aces, bobs)
	}
	every := shareOf("ace", []string{"ace"}, n)
	servingOf := func(bobServes []int) service.Peers {
		peers := service.Peers{Members: members, Serving: make([][]string, n)}
		for _, p := range bobServes {
			peers.Serving[p] = []string{"bob"}
		}
		return peers
	}
	in := func(list []int) func(int) bool { return func(p int) bool { return slices.Contains(list, p) } }
	for _, tc := range []struct {
		name      string
		members   []string
		bobServes []int
		aceServes []int
		want      []int
	}{
		{"alone", []string{"ace"}, nil, nil, every},
		{"bob joins and serves nothing yet", members, nil, every, every},
		{"bob serves one of his", members, bobs[:1], every, slices.DeleteFunc(slices.Clone(every), func(p int) bool { return p == bobs[0] })},
		{"bob serves his share", members, bobs, every, aces},
		{"ace joins: its share, nothing kept", members, every, nil, aces},
		{"bob leaves", []string{"ace"}, bobs, aces, every},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := targetOf("ace", tc.members, servingOf(tc.bobServes), n, in(tc.aceServes))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ace's target (-want +got):\n%s", diff)
			}
		})
	}
}

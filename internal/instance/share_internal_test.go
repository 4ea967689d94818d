package instance

import (
	"fmt"
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

// The partitions are dealt evenly, and a member joining takes its share
// from the others with few moves besides.
func TestDealIsFairAndMovesLittle(t *testing.T) {
	t.Parallel()
	const n = 64
	var members []string
	for i := range 8 {
		members = append(members, fmt.Sprintf("M%02dX7Q", i))
	}
	for size := 1; size <= len(members); size++ {
		owners := deal(members[:size], n)
		count := map[string]int{}
		for _, m := range owners {
			count[m]++
		}
		fair := (n + size - 1) / size
		for _, m := range members[:size] {
			if count[m] < n/size || count[m] > fair {
				t.Errorf("%d members: %s is dealt %d of %d, want %d to %d", size, m, count[m], n, n/size, fair)
			}
		}
		if size == 1 {
			continue
		}
		before := deal(members[:size-1], n)
		moved := 0
		for p := range owners {
			if owners[p] != before[p] && owners[p] != members[size-1] {
				moved++
			}
		}
		// A new member's share moves necessarily; a bounded deal moves a
		// few more, between the others.
		if moved > n/size {
			t.Errorf("%d members: %d partitions moved between the members already there", size, moved)
		}
	}
}

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
	aces, bobs := shareOf("ace", members, n, 1), shareOf("bob", members, n, 1)
	if len(aces) == 0 || len(bobs) == 0 || len(aces)+len(bobs) != n {
		t.Fatalf("16 partitions dealt to two as %v and %v", aces, bobs)
	}
	every := shareOf("ace", []string{"ace"}, n, 1)
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
			got := targetOf("ace", tc.members, servingOf(tc.bobServes), n, 1, in(tc.aceServes))
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("ace's target (-want +got):\n%s", diff)
			}
		})
	}
}

// The partitions are dealt evenly, each to as many members as it has
// copies, and a member joining takes its share from the others with few
// moves besides.
func TestDealIsFairAndMovesLittle(t *testing.T) {
	t.Parallel()
	const n = 64
	var members []string
	for i := range 8 {
		members = append(members, fmt.Sprintf("M%02dX7Q", i))
	}
	for _, copies := range []int{1, 2} {
		for size := 1; size <= len(members); size++ {
			owners := deal(members[:size], n, copies)
			count := map[string]int{}
			for p, of := range owners {
				if want := min(copies, size); len(of) != want || len(slices.Compact(slices.Sorted(slices.Values(of)))) != want {
					t.Errorf("%d copies, %d members: partition %d dealt to %v", copies, size, p, of)
				}
				for _, m := range of {
					count[m]++
				}
			}
			total := n * min(copies, size)
			for _, m := range members[:size] {
				if count[m] < total/size || count[m] > (total+size-1)/size+1 {
					t.Errorf("%d copies, %d members: %s is dealt %d of %d, want %d or about", copies, size, m, count[m], total, total/size)
				}
			}
			if size == 1 {
				continue
			}
			before := deal(members[:size-1], n, copies)
			moved := 0
			for p := range owners {
				for _, m := range owners[p] {
					if m != members[size-1] && !slices.Contains(before[p], m) {
						moved++
					}
				}
			}
			// A new member's share moves necessarily; a bounded deal
			// moves a few more, between the others.
			if moved > total/size {
				t.Errorf("%d copies, %d members: %d partitions moved between the members already there", copies, size, moved)
			}
		}
	}
}

// With two copies a partition, a member keeps what it serves until both
// members it is dealt to serve it.
func TestTargetWithCopiesKeepsUntilEachCopyServes(t *testing.T) {
	t.Parallel()
	const n = 8
	members := []string{"ace", "bob", "cat"}
	owners := deal(members, n, 2)
	// A partition ace is not dealt: both its members serve it, or one.
	p := slices.IndexFunc(owners, func(of []string) bool { return !slices.Contains(of, "ace") })
	if p < 0 {
		t.Fatalf("ace is dealt every partition: %v", owners)
	}
	peers := service.Peers{Members: members, Serving: make([][]string, n)}
	peers.Serving[p] = owners[p][:1]
	serves := func(q int) bool { return q == p }
	if got := targetOf("ace", members, peers, n, 2, serves); !slices.Contains(got, p) {
		t.Errorf("ace let partition %d go with one of its two members serving it: %v", p, got)
	}
	peers.Serving[p] = owners[p]
	if got := targetOf("ace", members, peers, n, 2, serves); slices.Contains(got, p) {
		t.Errorf("ace kept partition %d with both its members serving it: %v", p, got)
	}
}

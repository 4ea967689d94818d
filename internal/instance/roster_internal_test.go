package instance

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/novox/mesh-provisioner/service"
)

// A member is gone once goneAfter rounds in a row have not heard of it,
// however long the rounds took; one that serves and no longer announces
// itself is gone at its second round so; the first share's members count
// before any round.
func TestRosterCountsRoundsNotTime(t *testing.T) {
	t.Parallel()
	announced := func(members ...string) service.Peers { return service.Peers{Members: members} }
	leaving := func(member string, members ...string) service.Peers {
		return service.Peers{Members: members, Serving: [][]string{{member}}}
	}
	for _, tc := range []struct {
		name   string
		first  []string
		rounds []service.Peers
		want   []string
	}{
		{"the first share's members, before any round", []string{"ace", "bob", "cat"}, nil, []string{"ace", "bob", "cat"}},
		{"bob late in the first round", []string{"ace", "bob"}, []service.Peers{announced("ace")}, []string{"ace", "bob"}},
		{"bob late twice", []string{"ace", "bob"}, []service.Peers{announced("ace", "bob"), announced("ace"), announced("ace")}, []string{"ace", "bob"}},
		{"bob not heard of three rounds in a row", []string{"ace", "bob"}, []service.Peers{announced("ace"), announced("ace"), announced("ace")}, []string{"ace"}},
		{"bob heard between misses", []string{"ace", "bob"}, []service.Peers{announced("ace"), announced("ace"), announced("ace", "bob"), announced("ace"), announced("ace")}, []string{"ace", "bob"}},
		{"cat joins", []string{"ace"}, []service.Peers{announced("ace", "cat")}, []string{"ace", "cat"}},
		{"bob leaves, serving on: one round", []string{"ace", "bob"}, []service.Peers{leaving("bob", "ace")}, []string{"ace", "bob"}},
		{"bob leaves, serving on: two rounds", []string{"ace", "bob"}, []service.Peers{leaving("bob", "ace"), leaving("bob", "ace")}, []string{"ace"}},
		{"bob leaves and comes back", []string{"ace", "bob"}, []service.Peers{leaving("bob", "ace"), leaving("bob", "ace"), leaving("bob", "ace", "bob")}, []string{"ace", "bob"}},
		{"ace itself unheard (it left)", []string{"ace", "bob"}, []service.Peers{leaving("ace", "bob"), leaving("ace", "bob"), leaving("ace", "bob")}, []string{"ace", "bob"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := newRoster("ace", tc.first)
			for _, peers := range tc.rounds {
				r.heard(peers)
			}
			if diff := cmp.Diff(tc.want, r.members()); diff != "" {
				t.Errorf("members (-want +got):\n%s", diff)
			}
			if r.others() != len(tc.want)-1 {
				t.Errorf("others: %d, want %d", r.others(), len(tc.want)-1)
			}
		})
	}
}

// The members seen serving without announcing themselves are forgotten
// once they serve no more: the roster does not grow with every member that
// ever left.
func TestRosterForgetsWhoLeft(t *testing.T) {
	t.Parallel()
	r := newRoster("ace", []string{"ace"})
	for i := range 100 {
		member := string(rune('A' + i%26))
		r.heard(service.Peers{Members: []string{"ace"}, Serving: [][]string{{member}}})
	}
	r.heard(service.Peers{Members: []string{"ace"}, Serving: [][]string{nil}})
	if len(r.unannounced) != 0 || len(r.missed) != 0 {
		t.Errorf("after the leavers stopped serving: unannounced %v, missed %v", r.unannounced, r.missed)
	}
}

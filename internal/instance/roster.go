package instance

import (
	"slices"

	"github.com/novox/mesh-provisioner/service"
)

// goneAfter is how many rounds of discovery in a row must not hear of a
// member before it is taken for gone: one answer late is not a move.
const goneAfter = 3

// roster keeps the members that share the partitions, as discovery hears
// of them round by round. Absence is counted in rounds, not in time since
// a member was last heard of: a round the share loop could not run (it
// was reading a partition taken on, for longer than the rounds' span) is
// not a round missed, so that the first answer late after it does not
// take its member for gone, deal again, and read again.
type roster struct {
	me string
	// missed holds the other members, each with the rounds in a row
	// that have not heard of it.
	missed map[string]int
	// unannounced holds the members that serve some partition and no
	// longer announce themselves (they leave), with the rounds in a row
	// seen so.
	unannounced map[string]int
}

// newRoster returns the roster of me, starting with members (those its
// first share was dealt among, so that the first round's late answers
// move nothing).
func newRoster(me string, members []string) *roster {
	r := &roster{me: me, missed: map[string]int{}, unannounced: map[string]int{}}
	for _, m := range members {
		if m != me {
			r.missed[m] = 0
		}
	}
	return r
}

// heard takes one round's answers. A member that serves and no longer
// announces itself leaves (Instance.leave): it is gone at its second
// round so, not goneAfter rounds later, lest its partitions wait.
func (r *roster) heard(peers service.Peers) {
	for m := range r.missed {
		if !slices.Contains(peers.Members, m) {
			if r.missed[m]++; r.missed[m] >= goneAfter {
				delete(r.missed, m)
			}
		}
	}
	unannounced := map[string]int{}
	for m := range serving(peers) {
		if m != r.me && !slices.Contains(peers.Members, m) {
			if unannounced[m] = r.unannounced[m] + 1; unannounced[m] >= 2 {
				delete(r.missed, m)
			}
		}
	}
	r.unannounced = unannounced
	for _, m := range peers.Members {
		if m != r.me {
			r.missed[m] = 0
		}
	}
}

// members returns the members, me among them, in name order.
func (r *roster) members() []string {
	out := []string{r.me}
	for m := range r.missed {
		out = append(out, m)
	}
	slices.Sort(out)
	return out
}

// others returns how many members there are besides me.
func (r *roster) others() int { return len(r.missed) }

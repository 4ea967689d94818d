package admission

import (
	"slices"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// heldDoor is a door whose goroutine serves one request at a time: it
// hands each to the test (taken) and waits for the test to let it go.
type heldDoor struct {
	*Door[string]
	taken chan string
	next  chan struct{}
}

func newHeldDoor(t *testing.T, most, total int, rate float64) *heldDoor {
	h := &heldDoor{taken: make(chan string, 1), next: make(chan struct{})}
	h.Door = NewDoor(most, total, rate, func(r string) {
		h.taken <- r
		<-h.next
	}, nil)
	t.Cleanup(func() {
		close(h.next) // serve the rest at once
		go func() {
			for range h.taken {
			}
		}()
		h.Close()
		close(h.taken)
	})
	return h
}

// served lets the request being served go, and returns the n served next
// in their order.
func (h *heldDoor) served(n int) []string {
	var order []string
	for range n {
		h.next <- struct{}{}
		order = append(order, <-h.taken)
	}
	return order
}

var ace, bob = Asker{Role: "node", Name: "ace"}, Asker{Role: "node", Name: "bob"}

// A long line delays another asker's request by at most one of its own:
// the lines take turns.
func TestDoorLinesTakeTurns(t *testing.T) {
	t.Parallel()
	h := newHeldDoor(t, 100, 100, 0)
	h.Enter(ace, "ace1")
	<-h.taken // being served as bob comes
	for _, r := range []string{"ace2", "ace3", "ace4"} {
		h.Enter(ace, r)
	}
	h.Enter(bob, "bob1")
	h.Enter(bob, "bob2")
	want := []string{"ace2", "bob1", "ace3", "bob2", "ace4"}
	if diff := cmp.Diff(want, h.served(len(want))); diff != "" {
		t.Errorf("served order (-want +got):\n%s", diff)
	}
}

func TestDoorDrops(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		most, total int
		rate        float64
		ace         int // requests ace makes at once
		wantAce     int // of them dropped
		wantBobIn   bool
	}{
		{name: "a full line drops its asker's", most: 3, total: 100, ace: 10, wantAce: 7, wantBobIn: true},
		// Beyond its first, every line holds 2 at most: bob's first
		// is let in all the same.
		{name: "full lines drop all but first requests", most: 100, total: 2, ace: 10, wantAce: 7, wantBobIn: true},
		{name: "past the rate", most: 100, total: 100, rate: 4, ace: 10, wantAce: 6, wantBobIn: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			h := newHeldDoor(t, tt.most, tt.total, tt.rate)
			h.Enter(bob, "bob0")
			<-h.taken // held: every later request waits in its line
			dropped := 0
			for i := range tt.ace {
				if !h.Enter(ace, "ace"+string(rune('a'+i))) {
					dropped++
				}
			}
			if dropped != tt.wantAce {
				t.Errorf("%d of ace's %d dropped, want %d", dropped, tt.ace, tt.wantAce)
			}
			if in := h.Enter(bob, "bob1"); in != tt.wantBobIn {
				t.Errorf("bob's request let in: %v, want %v", in, tt.wantBobIn)
			}
			top, all := h.Drops(10)
			if want := []DropCount{{ace, uint64(tt.wantAce)}}; !slices.Equal(top, want) || all != uint64(tt.wantAce) {
				t.Errorf("drops %v (all %d), want %v", top, all, want)
			}
		})
	}
}

// A door forgets idle askers' lines once it keeps many, so that a mesh of
// many askers does not grow it without bound.
func TestDoorForgetsIdleLines(t *testing.T) {
	t.Parallel()
	served := make(chan struct{})
	d := NewDoor(10, 10, 0, func(string) { served <- struct{}{} }, nil)
	defer d.Close()
	for i := range 10 * minSweep {
		d.Enter(Asker{Role: "node", Name: string(rune(i))}, "r")
		<-served // its line is idle from here
	}
	d.mu.Lock()
	kept := len(d.lines)
	d.mu.Unlock()
	if kept > 2*minSweep {
		t.Errorf("the door keeps %d lines after %d askers asked once, want at most %d", kept, 10*minSweep, 2*minSweep)
	}
}

// An asker past its rate is told so on one dropped request, then not again
// within tellEvery: its flood costs one answer a second.
func TestDoorTellsOncePastTheRate(t *testing.T) {
	t.Parallel()
	d := NewDoor(10, 16, 1, func(string) {}, nil) // 1 a second, burst 1
	t.Cleanup(d.Close)
	var got []string
	for range 200 {
		admitted, tell := d.Admit(ace)
		switch {
		case admitted:
			got = append(got, "admitted")
		case tell:
			got = append(got, "told")
		}
	}
	if want := []string{"admitted", "told"}; !slices.Equal(got, want) {
		t.Errorf("200 tries at once: %v, want %v", got, want)
	}
	if _, tell := d.Admit(bob); tell {
		t.Error("bob, within his rate, was told he is past it")
	}
	// A tell taken back (its request could not be answered) is given at
	// the next drop that reads the clock: one in refillEvery.
	d.Untell(ace)
	told := 0
	for range refillEvery {
		if _, tell := d.Admit(ace); tell {
			told++
		}
	}
	if told != 1 {
		t.Errorf("%d tries after Untell: told %d times, want once", refillEvery, told)
	}
}

// BenchmarkDoorDrop is what a flood's request past its asker's line costs
// the door: no allocation, and no clock read or log call each.
func BenchmarkDoorDrop(b *testing.B) {
	block := make(chan struct{})
	d := NewDoor(1, 16, 1, func(string) { <-block }, func(Asker) {})
	defer func() { close(block); d.Close() }()
	d.Enter(ace, "served: blocks the door's goroutine")
	b.ReportAllocs()
	for b.Loop() {
		d.Enter(ace, "dropped")
	}
}

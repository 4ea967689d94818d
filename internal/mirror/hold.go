package mirror

import (
	"sync"
)

// Hold changes, while the copies are followed, which nodes the copies of
// needs, applied records and items hold (SetHolds set them first): the keys
// of the nodes holds no longer says yes to are dropped at once, and every key
// of those it says yes to now, and did not before, is read from its bucket
// again. The channel returned is closed once each of the three copies holds
// the nodes held now whole: every change of theirs up to a revision of its
// bucket after the call. holds must answer the same for a node from then
// on: a change of what is held is another Hold. A Hold made before the last one's keys are read
// whole reads them too, and closes both channels when done.
//
// Each of the three buckets is read whole again, as at the start (one
// consumer of every key's last value, which then goes on as the bucket's
// watcher): the partition of a key is not in its subject.
func (w *Watchers) Hold(holds func(node string) bool) <-chan struct{} {
	var waits []<-chan struct{}
	for _, f := range w.followers {
		if w.mirror.isPartial(f.copy) {
			waits = append(waits, f.requestHold(holds))
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, wait := range waits {
			<-wait
		}
	}()
	return done
}

// LetGo has the copies of needs, applied records and items hold the nodes
// holds says yes to, fewer than they hold: the keys of the others are
// dropped at once, and nothing is read again (unless a Hold is still being
// read, which is read again with holds).
func (w *Watchers) LetGo(holds func(node string) bool) {
	for _, f := range w.followers {
		if w.mirror.isPartial(f.copy) {
			f.letGo(holds)
		}
	}
}

// letGo narrows what the follower's copy holds to holds.
func (f *follower) letGo(holds func(first string) bool) {
	f.mu.Lock()
	pending := f.hold != nil
	f.mu.Unlock()
	if pending {
		f.requestHold(holds)
		return
	}
	f.applying.Lock()
	defer f.applying.Unlock()
	f.copy.setHolds(holds)
	f.copy.dropUnheld()
}

// isPartial reports whether c is a copy that may hold some nodes only.
func (m *Mirror) isPartial(c followed) bool {
	for _, p := range m.partial() {
		if p == c {
			return true
		}
	}
	return false
}

// holdChange is a change of the nodes a copy holds, until its keys are read
// whole.
type holdChange struct {
	holds func(first string) bool
	// wasHeld says which nodes the copy held whole before: the others
	// holds says yes to are read (adding).
	wasHeld func(first string) bool
	dones   []*closer // of this Hold and of those it took over
}

// adding reports whether the change has the copy hold first's keys anew.
func (h *holdChange) adding(first string) bool { return h.holds(first) && !h.wasHeld(first) }

// closer closes its channel once.
type closer struct {
	once sync.Once
	ch   chan struct{}
}

func (c *closer) close() { c.once.Do(func() { close(c.ch) }) }

// requestHold has the follower's next consumer read the keys of the nodes
// holds says yes to and the copy did not hold, and returns a channel closed
// once it did. The consumer being followed is ended, so that it starts now.
func (f *follower) requestHold(holds func(first string) bool) <-chan struct{} {
	done := &closer{ch: make(chan struct{})}
	f.mu.Lock()
	// The nodes held whole before: those of the last change read whole,
	// not of one still pending, whose keys this one reads too.
	change := &holdChange{holds: holds, wasHeld: f.copy.heldNow(), dones: []*closer{done}}
	if prev := f.hold; prev != nil {
		change.wasHeld = prev.wasHeld
		change.dones = append(change.dones, prev.dones...)
	}
	f.hold = change
	if f.cancel != nil {
		f.cancel()
	}
	f.mu.Unlock()
	select {
	case f.kick <- struct{}{}:
	default:
	}
	return done.ch
}

// takeHold returns the change of the nodes held that the next consumer reads,
// if any, once the copy holds them: the keys of the others are dropped.
func (f *follower) takeHold() *holdChange {
	f.mu.Lock()
	change := f.hold
	f.mu.Unlock()
	if change == nil {
		return nil
	}
	f.applying.Lock()
	defer f.applying.Unlock()
	f.copy.setHolds(change.holds)
	f.copy.dropUnheld()
	return change
}

// held records that a change's keys are read whole: its channels close.
func (f *follower) held(change *holdChange) {
	f.mu.Lock()
	if f.hold == change {
		f.hold = nil
	}
	f.mu.Unlock()
	for _, done := range change.dones {
		done.close()
	}
}

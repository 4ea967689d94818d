package service

import (
	"cmp"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/wire"
)

// A door admits an addressed endpoint's requests fairly. Its micro callback
// reads only whom a request is from (the subject's token, which nats-server
// confines to the asker's own) and puts it in that asker's line, unless the
// asker asks faster than the door's rate or its line is full: then the
// request is dropped unanswered, counted by asker. One goroutine takes the
// lines' heads in turn, so that an asker with a long line delays another's
// request by at most one of its own.
//
// Without it, every asker's requests waited in the subscription's one
// buffer, and a node flooding its own subject (750,000 requests a second
// from one process) filled it: the buffer dropped whatever came next,
// another node's requests with the flood's, before the per-asker bound
// could tell them apart (issue 37).
type door[R any] struct {
	// serve handles a request taken from its line, as the micro callback
	// did before there were lines.
	serve func(r R)
	// most is a line's length; beyond each line's first request, all
	// lines hold at most total, so that the askers' first requests are
	// always let in (one an identity: nats-server confines askers to their
	// own subjects).
	most, total int
	// rate is the requests a second an asker may make, burst at once
	// (Config.MaxRatePerAsker); no bound when rate is zero.
	rate, burst float64

	mu sync.Mutex
	// lines are the askers' that hold requests or tokens spent lately;
	// the others' are forgotten once more than sweepAt are kept.
	lines   map[addressee]*line[R]
	sweepAt int
	turns   []*line[R] // the lines holding requests, in turn
	queued  int        // requests in lines beyond each line's first
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	// dropped counts the requests dropped by asker, for at most
	// maxDropAskers askers; others' are counted in droppedOthers.
	dropped       map[addressee]uint64
	droppedOthers uint64
	// onDrop is called, outside the lock, at an asker's first drop and
	// every dropTold-th after it.
	onDrop func(who addressee)
}

// lineLength is the most requests an asker's line holds: a burst several
// times what one asker may have answered at once (DefaultMaxPerAsker), so
// that those past its places are refused with a 503 it can act on, not
// dropped; only an asker that outpaces the door loses requests.
const lineLength = PendingMsgsLimit / 16

// maxDropAskers bounds the askers whose drops are counted by name: a
// flood's askers are few, and a mesh of many askers dropping is overloaded
// as a whole.
const maxDropAskers = 4096

// line is one asker's requests, oldest first, and what it may ask yet:
// tokens, refilled at the door's rate up to its burst since refilled.
type line[R any] struct {
	who      addressee
	reqs     []R
	tokens   float64
	refilled time.Time
	// refused counts the tries since the last without a token: the clock
	// is read at one in refillEvery of them, so that a flood's drops cost
	// no clock read each.
	refused uint
}

// refillEvery is how many tries without a token pass between two refills:
// at 1,000,000 tries a second, 64 µs.
const refillEvery = 64

// take spends one of l's tokens, refilling them first when none is left, and
// reports whether there was one.
func (l *line[R]) take(rate, burst float64) bool {
	if l.tokens < 1 {
		if l.refused++; l.refused%refillEvery != 1 {
			return false
		}
		now := time.Now()
		l.tokens = min(burst, l.tokens+now.Sub(l.refilled).Seconds()*rate)
		l.refilled = now
		if l.tokens < 1 {
			return false
		}
		l.refused = 0
	}
	l.tokens--
	return true
}

// minSweep is the fewest lines a door keeps before it forgets the idle.
const minSweep = 1024

func newDoor[R any](most, total int, rate float64, serve func(R), onDrop func(addressee)) *door[R] {
	d := &door[R]{serve: serve, most: most, total: total, rate: rate, burst: max(rate, 1), lines: map[addressee]*line[R]{}, sweepAt: minSweep,
		wake: make(chan struct{}, 1), done: make(chan struct{}), dropped: map[addressee]uint64{}, onDrop: onDrop}
	go d.run()
	return d
}

// enter puts r in who's line, or drops it and reports false (admit, then
// put).
func (d *door[R]) enter(who addressee, r R) bool {
	if !d.admit(who) {
		return false
	}
	d.put(who, r)
	return true
}

// admit reports whether who may put a request in its line now: the door is
// open, its line and all lines have room, and who asks within the rate.
// Otherwise the request is dropped, counted by asker. Only the goroutine
// that puts requests in the door admits them, so a line admitted has room
// until put.
func (d *door[R]) admit(who addressee) bool {
	d.mu.Lock()
	l := d.lines[who]
	if l == nil {
		if len(d.lines) >= d.sweepAt {
			d.sweep()
		}
		l = &line[R]{who: who, tokens: d.burst, refilled: time.Now()}
		d.lines[who] = l
	}
	n := len(l.reqs)
	if !d.closed && n < d.most && (n == 0 || d.queued < d.total) && (d.rate == 0 || l.take(d.rate, d.burst)) {
		d.mu.Unlock()
		return true
	}
	dropped := d.countDrop(who)
	d.mu.Unlock()
	// Told at the first drop and then every dropTold-th of the asker's,
	// which onDrop's log limits further: a flood's drops cost no clock read
	// or lock of the log's each.
	if d.onDrop != nil && dropped%dropTold == 1 {
		d.onDrop(who)
	}
	return false
}

// put puts r, admitted, at the end of who's line.
func (d *door[R]) put(who addressee, r R) {
	d.mu.Lock()
	l := d.lines[who]
	if l == nil { // swept between admit and put: idle, and so empty
		l = &line[R]{who: who, tokens: d.burst, refilled: time.Now()}
		d.lines[who] = l
	}
	n := len(l.reqs)
	l.reqs = append(l.reqs, r)
	if n == 0 {
		d.turns = append(d.turns, l)
	} else {
		d.queued++
	}
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
}

// dropTold is how many of an asker's drops pass between two calls of onDrop.
const dropTold = 1 << 16

// countDrop counts a drop of who's, and returns its count of them (that of
// all others', past maxDropAskers).
func (d *door[R]) countDrop(who addressee) uint64 {
	if _, ok := d.dropped[who]; ok || len(d.dropped) < maxDropAskers {
		d.dropped[who]++
		return d.dropped[who]
	}
	d.droppedOthers++
	return d.droppedOthers
}

// sweep forgets the lines that hold no request and whose tokens are
// refilled by now, and sets when to sweep next: a mesh's askers are many,
// a door's busy ones few.
func (d *door[R]) sweep() {
	now := time.Now()
	for who, l := range d.lines {
		if len(l.reqs) == 0 && (d.rate == 0 || l.tokens+now.Sub(l.refilled).Seconds()*d.rate >= d.burst) {
			delete(d.lines, who)
		}
	}
	d.sweepAt = max(minSweep, 2*len(d.lines))
}

// next takes the head of the line whose turn it is, or reports false when
// no line holds a request.
func (d *door[R]) next() (r R, ok bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if len(d.turns) == 0 {
		return r, false
	}
	l := d.turns[0]
	d.turns = d.turns[1:]
	r = l.reqs[0]
	var zero R
	l.reqs[0] = zero
	l.reqs = l.reqs[1:]
	if len(l.reqs) > 0 {
		d.queued--
		d.turns = append(d.turns, l)
	}
	return r, true
}

// run serves the lines in turn until the door is closed and they are empty.
func (d *door[R]) run() {
	defer close(d.done)
	for {
		r, ok := d.next()
		if ok {
			d.serve(r)
			continue
		}
		d.mu.Lock()
		closed := d.closed
		d.mu.Unlock()
		if closed {
			return
		}
		<-d.wake
	}
}

// close stops letting requests in, and returns once those in lines are
// served.
func (d *door[R]) close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	<-d.done
}

// dropCount is a count of the requests of one asker dropped at a door.
type dropCount struct {
	who   addressee
	count uint64
}

// drops returns the askers with the most requests dropped, at most n, the
// most first, and the count of all requests dropped.
func (d *door[R]) drops(n int) (top []dropCount, all uint64) {
	d.mu.Lock()
	for who, c := range d.dropped {
		top = append(top, dropCount{who, c})
		all += c
	}
	all += d.droppedOthers
	d.mu.Unlock()
	slices.SortFunc(top, func(a, b dropCount) int {
		return cmp.Or(cmp.Compare(b.count, a.count), cmp.Compare(a.who.name, b.who.name))
	})
	return top[:min(n, len(top))], all
}

// handlerOf returns the micro handler of an endpoint: prepare reads and
// checks each request on the callback, where micro counts its refusals,
// and returns what answers it. On an endpoint whose subject names its asker
// (owner set; the asker is the token after prefix) a door of the
// endpoint's own stands before prepare, at most rate a second of each asker
// (no bound when zero), and the answer waits in the asker's line; the
// service closes the door as it stops. Elsewhere the answer follows on the
// callback.
func (s *Service) handlerOf(name, prefix string, owner wire.Role, rate int, count *counters, prepare func(micro.Request) func(onCallback bool)) micro.Handler {
	if owner == "" {
		return micro.HandlerFunc(func(r micro.Request) {
			if answer := prepare(r); answer != nil {
				answer(true)
			}
		})
	}
	// Precomputed, so that a flood's drops allocate nothing to be told.
	cause := "dropped at " + name
	message := "requests of a " + string(owner) + " dropped unanswered at the " + name + " endpoint: it asked faster than its rate (serve --max-rate-per-asker; --max-write-rate-per-asker on the write verbs), or than its requests are read"
	d := newDoor(lineLength, PendingMsgsLimit, float64(rate), func(answer func(bool)) { answer(false) }, func(who addressee) {
		s.warnings.Log(slog.LevelWarn, cause, who.name, message)
	})
	count.door = d
	s.doorsMu.Lock()
	s.doors = append(s.doors, d)
	s.doorsMu.Unlock()
	return micro.HandlerFunc(func(r micro.Request) {
		who := addressee{role: owner, name: askerToken(r.Subject(), prefix)}
		if !d.admit(who) {
			return
		}
		if answer := prepare(r); answer != nil {
			d.put(who, answer)
		}
	})
}

// pendingLimits bounds the pending buffer of an endpoint whose asker its
// subject names (owner set: it has a door) or not.
func pendingLimits(owner wire.Role) micro.EndpointOpt {
	if owner == "" {
		return micro.WithEndpointPendingLimits(PendingMsgsLimit, PendingBytesLimit)
	}
	return micro.WithEndpointPendingLimits(DoorPendingMsgsLimit, PendingBytesLimit)
}

// askerToken is the token of subject after prefix and its dot.
func askerToken(subject, prefix string) string {
	name := subject[min(len(prefix)+1, len(subject)):]
	if i := strings.IndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	return name
}

// closeDoors stops the doors letting requests in and returns once what they
// let in is served: after micro stopped reading requests, before the
// workers stop.
func (s *Service) closeDoors() {
	s.doorsMu.Lock()
	doors := s.doors
	s.doorsMu.Unlock()
	for _, d := range doors {
		d.close()
	}
}

// topDroppers is how many askers an endpoint's stats name (dropped_by_asker).
const topDroppers = 10

// dropped is the count of the endpoint's requests dropped at its door.
func (c *counters) dropped() uint64 {
	if c.door == nil {
		return 0
	}
	_, all := c.door.drops(0)
	return all
}

// droppedByAsker names the askers with the most requests dropped at the
// endpoint's door.
func (c *counters) droppedByAsker() []*provisionerv1.AskerDrops {
	if c.door == nil {
		return nil
	}
	top, _ := c.door.drops(topDroppers)
	out := make([]*provisionerv1.AskerDrops, 0, len(top))
	for _, x := range top {
		out = append(out, &provisionerv1.AskerDrops{Role: string(x.who.role), Name: x.who.name, Dropped: x.count})
	}
	return out
}

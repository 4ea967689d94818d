package admission

import (
	"cmp"
	"slices"
	"sync"
	"time"
)

// A Door admits an addressed endpoint's requests fairly. Its micro callback
// reads only whom a request is from (the subject's token, which nats-server
// confines to the asker's own) and puts it in that asker's line, unless the
// asker asks faster than the door's rate or its line is full: then the
// request is dropped, counted by asker, and unanswered but for one an
// asker each second past the rate (Admit's tell). One goroutine takes the
// lines' heads in turn, so that an asker with a long line delays another's
// request by at most one of its own.
//
// Without it, every asker's requests waited in the subscription's one
// buffer, and a node flooding its own subject (750,000 requests a second
// from one process) filled it: the buffer dropped whatever came next,
// another node's requests with the flood's, before the per-asker bound
// could tell them apart (issue 37).
type Door[R any] struct {
	// serve handles a request taken from its line, as the micro callback
	// did before there were lines.
	serve func(r R)
	// most is a line's length; beyond each line's first request, all
	// lines hold at most total, so that the askers' first requests are
	// always let in (one an identity: nats-server confines askers to their
	// own subjects).
	most, total int
	// rate is the requests a second an asker may make, burst at once
	// (service.Config.MaxRatePerAsker); no bound when rate is zero.
	rate, burst float64

	mu sync.Mutex
	// lines are the askers' that hold requests or tokens spent lately;
	// the others' are forgotten once more than sweepAt are kept.
	lines   map[Asker]*line[R]
	sweepAt int
	turns   []*line[R] // the lines holding requests, in turn
	queued  int        // requests in lines beyond each line's first
	closed  bool
	wake    chan struct{}
	done    chan struct{}
	// dropped counts the requests dropped by asker, for at most
	// maxDropAskers askers; others' are counted in droppedOthers.
	dropped       map[Asker]uint64
	droppedOthers uint64
	// onDrop is called, outside the lock, at an asker's first drop and
	// every dropTold-th after it.
	onDrop func(who Asker)
}

// LineLength is the most requests an asker's line holds: a burst several
// times what one asker may have answered at once (service.DefaultMaxPerAsker), so
// that those past its places are refused with a 503 it can act on, not
// dropped; only an asker that outpaces the door loses requests.
const LineLength = 256

// maxDropAskers bounds the askers whose drops are counted by name: a
// flood's askers are few, and a mesh of many askers dropping is overloaded
// as a whole.
const maxDropAskers = 4096

// line is one asker's requests, oldest first, and what it may ask yet:
// tokens, refilled at the door's rate up to its burst since refilled.
type line[R any] struct {
	who      Asker
	reqs     []R
	tokens   float64
	refilled time.Time
	// refused counts the tries since the last without a token: the clock
	// is read at one in refillEvery of them, so that a flood's drops cost
	// no clock read each.
	refused uint
	// told is when the asker was last told it asks past its rate.
	told time.Time
}

// refillEvery is how many tries without a token pass between two refills:
// at 1,000,000 tries a second, 64 µs.
const refillEvery = 64

// take spends one of l's tokens, refilling them first when none is left, and
// reports whether there was one; and, when there was none, whether the
// asker is to be told so: at most once every tellEvery, on a try that read
// the clock anyway.
func (l *line[R]) take(rate, burst float64) (ok, tell bool) {
	if l.tokens < 1 {
		if l.refused++; l.refused%refillEvery != 1 {
			return false, false
		}
		now := time.Now()
		l.tokens = min(burst, l.tokens+now.Sub(l.refilled).Seconds()*rate)
		l.refilled = now
		if l.tokens < 1 {
			if now.Sub(l.told) < tellEvery {
				return false, false
			}
			l.told = now
			return false, true
		}
		l.refused = 0
	}
	l.tokens--
	return true, false
}

// tellEvery is how often at most an asker past its rate is told so, in an
// answer to one of its dropped requests: an honest asker learns why its
// requests go unanswered, and a flood costs one answer a second.
const tellEvery = time.Second

// minSweep is the fewest lines a door keeps before it forgets the idle.
const minSweep = 1024

// NewDoor returns a door whose lines hold most requests each and total
// beyond each line's first, admitting rate requests a second of an asker
// (no bound when zero); serve handles each request taken from its line, and
// onDrop, if set, hears of an asker's drops. Its goroutine runs until Close.
func NewDoor[R any](most, total int, rate float64, serve func(R), onDrop func(Asker)) *Door[R] {
	d := &Door[R]{serve: serve, most: most, total: total, rate: rate, burst: max(rate, 1), lines: map[Asker]*line[R]{}, sweepAt: minSweep,
		wake: make(chan struct{}, 1), done: make(chan struct{}), dropped: map[Asker]uint64{}, onDrop: onDrop}
	go d.run()
	return d
}

// Enter puts r in who's line, or drops it and reports false (Admit, then
// Put).
func (d *Door[R]) Enter(who Asker, r R) bool {
	if admitted, _ := d.Admit(who); !admitted {
		return false
	}
	d.Put(who, r)
	return true
}

// Admit reports whether who may put a request in its line now: the door is
// open, its line and all lines have room, and who asks within the rate.
// Otherwise the request is dropped, counted by asker, and tell says whether
// to answer this one with why (past the rate, at most once every
// tellEvery an asker; a drop is otherwise unanswered). An asker's
// requests are admitted and put by one goroutine at a time (its
// endpoint's subscription, or its partition's), so its line admitted has
// room until put; all lines together may hold, beyond total, one request
// more for each other goroutine admitting at once.
func (d *Door[R]) Admit(who Asker) (admitted, tell bool) {
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
	if !d.closed && n < d.most && (n == 0 || d.queued < d.total) {
		if d.rate == 0 {
			d.mu.Unlock()
			return true, false
		}
		var ok bool
		if ok, tell = l.take(d.rate, d.burst); ok {
			d.mu.Unlock()
			return true, false
		}
	}
	dropped := d.countDrop(who)
	d.mu.Unlock()
	// Told at the first drop and then every dropTold-th of the asker's,
	// which onDrop's log limits further: a flood's drops cost no clock read
	// or lock of the log's each.
	if d.onDrop != nil && dropped%dropTold == 1 {
		d.onDrop(who)
	}
	return false, tell
}

// Untell takes back the tell Admit just gave who, when the request it was
// for may not be answered (its reply subject is not the asker's inbox):
// the next drop past the rate tells instead.
func (d *Door[R]) Untell(who Asker) {
	d.mu.Lock()
	if l := d.lines[who]; l != nil {
		l.told = time.Time{}
	}
	d.mu.Unlock()
}

// Put puts r, admitted, at the end of who's line.
func (d *Door[R]) Put(who Asker, r R) {
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
func (d *Door[R]) countDrop(who Asker) uint64 {
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
func (d *Door[R]) sweep() {
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
func (d *Door[R]) next() (r R, ok bool) {
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
func (d *Door[R]) run() {
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

// Close stops letting requests in, and returns once those in lines are
// served.
func (d *Door[R]) Close() {
	d.mu.Lock()
	d.closed = true
	d.mu.Unlock()
	select {
	case d.wake <- struct{}{}:
	default:
	}
	<-d.done
}

// DropCount is a count of the requests of one asker dropped at a door.
type DropCount struct {
	Who   Asker
	Count uint64
}

// Drops returns the askers with the most requests dropped, at most n, the
// most first, and the count of all requests dropped.
func (d *Door[R]) Drops(n int) (top []DropCount, all uint64) {
	d.mu.Lock()
	for who, c := range d.dropped {
		top = append(top, DropCount{Who: who, Count: c})
		all += c
	}
	all += d.droppedOthers
	d.mu.Unlock()
	slices.SortFunc(top, func(a, b DropCount) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Who.Name, b.Who.Name))
	})
	return top[:min(n, len(top))], all
}

package admission

import "sync"

// Flights are the answers being built, by cache key: a request that misses
// the answer cache while an identical one (the same key, read at the same
// stamp) is being built waits for that one's answer rather than take a
// place in the queue and a worker of its own. A flood of one request, whose
// cached answer every write of what it reads makes stale, otherwise filled
// the queue with copies of one computation after each write, and every
// other asker got the 503 of a full queue.
type Flights[K, S comparable] struct {
	mu sync.Mutex
	m  map[K]*flight[S]
	// waiting counts the requests waiting on every flight, at most most;
	// more go the way of any request that misses the cache. A waiter holds
	// its request (a few hundred bytes) until its flight lands.
	waiting, most int
}

// flight is an answer being built, and the requests waiting for it: each
// is given the answer's encoded body, without its tail, or nil if it was
// not built.
type flight[S comparable] struct {
	stamp   S
	waiters []func(body []byte)
}

// NewFlights returns the flights of answers being built, at most most
// requests waiting on them all.
func NewFlights[K, S comparable](most int) *Flights[K, S] {
	return &Flights[K, S]{m: map[K]*flight[S]{}, most: most}
}

// Join makes wait a waiter of the flight of key at st and reports true, or,
// when there is none, makes the caller that flight's builder: it returns
// land, to call with the answer's body once it is built (nil if it was
// not), which runs the waiters. A flight of key at another stamp is not
// joined, nor any while most requests wait: the caller builds, as without
// flights, and gets a nil land.
func (f *Flights[K, S]) Join(key K, st S, wait func(body []byte)) (joined bool, land func(body []byte)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.m[key]; ok {
		if fl.stamp != st || f.waiting >= f.most {
			return false, nil
		}
		fl.waiters = append(fl.waiters, wait)
		f.waiting++
		return true, nil
	}
	fl := &flight[S]{stamp: st}
	f.m[key] = fl
	return false, func(body []byte) {
		f.mu.Lock()
		delete(f.m, key)
		waiters := fl.waiters
		f.waiting -= len(waiters)
		f.mu.Unlock()
		for _, w := range waiters {
			w(body)
		}
	}
}

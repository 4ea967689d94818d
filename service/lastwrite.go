package service

import (
	"context"
	"sync"
)

// lastWrites reads, for the applies, the revision of a node's newest write
// in a bucket (lastUnder its "<node>." prefix), sharing one read among the
// node's applies that ask while another read is out. Each caller is
// answered by a read sent after it asked, so every write acknowledged
// before it asked is at or below the revision it gets; callers that arrive
// while a read is out wait for the next one (golang.org/x/sync/singleflight
// would hand them the read already out, which may predate their arrival).
//
// Measured with `make bench-write`: a node applying its 30 modules at once
// read its modules' newest writes 30 times, 1.86-1.96x the time of 300
// direct async puts; sharing the read, see docs/footprint.md.
type lastWrites struct {
	read func(ctx context.Context, prefix string) (uint64, error)
	// base bounds the shared reads: the service's life.
	base context.Context

	mu      sync.Mutex
	next    map[string]*revisionRound // by prefix: the round callers join, not yet sent
	sending map[string]bool           // by prefix: a goroutine sends its rounds
}

// revisionRound is one read and the callers that share it.
type revisionRound struct {
	done     chan struct{}
	revision uint64
	err      error
}

func newLastWrites(base context.Context, read func(ctx context.Context, prefix string) (uint64, error)) *lastWrites {
	return &lastWrites{read: read, base: base, next: map[string]*revisionRound{}, sending: map[string]bool{}}
}

// get returns the revision of the newest write under prefix, read after get
// was called.
func (l *lastWrites) get(ctx context.Context, prefix string) (uint64, error) {
	l.mu.Lock()
	round := l.next[prefix]
	if round == nil {
		round = &revisionRound{done: make(chan struct{})}
		l.next[prefix] = round
	}
	if !l.sending[prefix] {
		l.sending[prefix] = true
		go l.send(prefix) //nolint:contextcheck // the read is shared: it outlives the caller that started it, bounded by the service's life (base)
	}
	l.mu.Unlock()
	select {
	case <-round.done:
		return round.revision, round.err
	case <-ctx.Done():
		return 0, ctx.Err()
	}
}

// send sends prefix's rounds one after another until none waits; the maps
// then forget prefix.
func (l *lastWrites) send(prefix string) {
	for {
		l.mu.Lock()
		round := l.next[prefix]
		delete(l.next, prefix)
		if round == nil {
			delete(l.sending, prefix)
			l.mu.Unlock()
			return
		}
		l.mu.Unlock()
		ctx, cancel := context.WithTimeout(l.base, writeTimeout)
		round.revision, round.err = l.read(ctx, prefix)
		cancel()
		close(round.done)
	}
}

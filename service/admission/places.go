package admission

import (
	"sync"

	"github.com/novox/mesh-provisioner/wire"
)

// Each node and provider asks on subjects of its own, to which nats-server
// confines it, and holds at most service.Config.MaxPerAsker of the service's places
// at once: its requests waiting for revisions, queued for a worker or being
// answered on one. Without the bound, one node asking distinct questions
// (another page size, another module) faster than the workers answer them
// filled the queue, and every other asker got "overloaded" 503s until it
// stopped; asking for revisions far ahead, it filled the places of requests
// that wait (MaxWaiting). Identical requests share one place (flights).
// Operators ask on the unscoped subjects, which nodes and providers are
// denied: they are not bounded here.

// Places counts the places each asker holds.
type Places struct {
	most int // no bound when zero
	mu   sync.Mutex
	held map[Asker]int
}

// NewPlaces returns the places of askers, at most most each (no bound
// when zero).
func NewPlaces(most int) *Places {
	return &Places{most: most, held: map[Asker]int{}}
}

// Full reports whether who holds every place it may: a request of its is
// refused before it is decoded, as one that finds the queue full.
func (p *Places) Full(who Asker) bool {
	if p.most == 0 || who.Role == "" {
		return false
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.held[who] >= p.most
}

// Take holds a place for who and returns how to give it back, once; nil when
// who holds every place it may.
func (p *Places) Take(who Asker) (give func()) {
	if p.most == 0 || who.Role == "" {
		return func() {}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.held[who] >= p.most {
		return nil
	}
	p.held[who]++
	return sync.OnceFunc(func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		if p.held[who]--; p.held[who] <= 0 {
			delete(p.held, who)
		}
	})
}

// AskerFull is the refusal of a request whose asker holds every place it
// may.
func (p *Places) AskerFull(who Asker) *wire.Error {
	return wire.Errorf(wire.CodeUnavailable, "the server is answering %d requests of %s %s already, the most it takes of one %s at once; ask again once they are answered",
		p.most, who.Role, who.Name, who.Role)
}

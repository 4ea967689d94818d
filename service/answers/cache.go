package answers

import (
	"container/list"
	"sync"
	"sync/atomic"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
)

// Stamp identifies what an answer read: the stamp of each copy, or of the
// node's group of it, that the answer read (see mirror.Copy.Stamp; zero
// for one it did not read), of the providers' buckets (mirror.Bound.StampOf
// the node, or Bound.Stamp for a read of every node's) and which copies
// were behind. Equal stamps mean an equal answer, but for
// its revisions and phases, which are added to it as it is sent.
type Stamp struct {
	registry, needs, applied, collect, manifests, bound uint64
	// behind has a bit for each copy that was behind (behindBits).
	behind uint64
}

// CacheKey is a request as the cache knows it: the endpoint, the encoding,
// and the request itself without its minimum revisions (which decide when
// it is answered, not what).
type CacheKey struct {
	endpoint string
	json     bool
	request  string
}

type cachedAnswer struct {
	key   CacheKey
	stamp Stamp
	// size is what the entry counts against the cache's budget.
	size int
	// used is set by each hit; eviction spares a used entry once, clearing
	// it (the CLOCK approximation of least recently used, so that a hit
	// takes only a read lock).
	used atomic.Bool
	// kept is the answer, bare and, once sent from the cache, whole.
	kept atomic.Pointer[keptAnswer]
}

// keptAnswer is an answer without its tail (body) and, once sent from the
// cache, as last sent whole, with the tail of the revisions it names
// (whole, nil before): reused as it is while they are unchanged. In binary
// the body is then the whole answer's prefix (Encoding.BodyOf), so that an
// answer is held once, not twice.
type keptAnswer struct {
	body      []byte
	whole     []byte
	revisions mirror.Revisions
}

// body returns the answer without its tail.
func (a *cachedAnswer) body() []byte { return a.kept.Load().body }

// answerCache keeps encoded answers for reuse, within a byte budget, the
// least recently used out first: a repeated request costs a lookup and a
// send.
type answerCache struct {
	limit int

	mu      sync.RWMutex
	entries map[CacheKey]*list.Element
	order   list.List // of *cachedAnswer, the newest first
	bytes   int

	hits, misses atomic.Uint64
}

func newAnswerCache(limit int) *answerCache {
	return &answerCache{limit: limit, entries: map[CacheKey]*list.Element{}}
}

// get returns the answer kept for key, if it was built from what st
// identifies.
func (c *answerCache) get(key CacheKey, st Stamp) (*cachedAnswer, bool) {
	if c.limit <= 0 {
		return nil, false
	}
	c.mu.RLock()
	defer c.mu.RUnlock()
	if el, ok := c.entries[key]; ok {
		if a := el.Value.(*cachedAnswer); a.stamp == st {
			a.used.Store(true)
			c.hits.Add(1)
			return a, true
		}
	}
	c.misses.Add(1)
	return nil, false
}

// put keeps an answer, replacing the key's older one and making room. It
// returns the entry, or nil when the answer is too large to keep.
func (c *answerCache) put(key CacheKey, st Stamp, data []byte) *cachedAnswer {
	a := &cachedAnswer{key: key, stamp: st, size: entrySize(key, len(data))}
	a.kept.Store(&keptAnswer{body: data})
	if a.size > c.limit/8 {
		return nil // one answer must not push out most of the others
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.entries[key]; ok {
		c.remove(el)
	}
	c.entries[key] = c.order.PushFront(a)
	c.bytes += a.size
	for c.bytes > c.limit {
		oldest := c.order.Back()
		if old := oldest.Value.(*cachedAnswer); old != a && old.used.Swap(false) {
			c.order.MoveToFront(oldest) // a second chance
			continue
		}
		c.remove(oldest)
	}
	return a
}

// entrySize is what an entry of an answer of n bytes holds: the answer
// once in binary, twice in JSON (bare and as last sent, which differ), and
// its bookkeeping and tail, roughly.
func entrySize(key CacheKey, n int) int {
	if key.json {
		n *= 2
	}
	return n + len(key.request) + 256
}

func (c *answerCache) remove(el *list.Element) {
	a := c.order.Remove(el).(*cachedAnswer)
	delete(c.entries, a.key)
	c.bytes -= a.size
}

// stats is the cache's part of the endpoint stats.
func (c *answerCache) stats() *provisionerv1.AnswerCacheStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return &provisionerv1.AnswerCacheStats{
		Entries: uint64(len(c.entries)),
		Bytes:   uint64(max(c.bytes, 0)),
		Limit:   int64(c.limit),
		Hits:    c.hits.Load(),
		Misses:  c.misses.Load(),
	}
}

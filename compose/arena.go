package compose

import (
	"unsafe"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Arena holds the messages of compositions' plans, plan items and
// collected items, and the strings of their keys and collections, in
// arrays, one element a need (or a collection item), rather than
// allocations a need: a node has thousands of needs, and each message
// allocated alone costs the garbage collector too. BenchmarkComposeNode
// measured 6,739 allocations and 650 µs a node without one, 2,730 and 510
// µs with one.
//
// An arena reused for composition after composition (Reset) spares the
// collector the arrays too: BenchmarkComposeNode, eight runs of each, put
// a 60 x 25 node at 0.83-0.97 ms (median 0.87) in arenas of its own and
// 0.75-0.82 ms (median 0.79) in one reused, with 657 KB allocated against
// 221. Its provisions, and the buffers and collections' sums of its Digest,
// are kept too: 228 KB and 2,953 allocations a node before, 144 KB and
// 2,754 after, and x0.90 of the time (BenchmarkComposeNode). The zero
// Arena is ready; an Arena is for one goroutine at a time.
type Arena struct {
	items      []provisionerv1.PlanItem
	buckets    []provisionerv1.PlanItem_Bucket
	keys       []provisionerv1.BucketKey
	verbs      []provisionerv1.PlanItem_Verb
	plans      []provisionerv1.ModulePlan
	collects   []provisionerv1.CollectedItem
	provisions []provisionerv1.Provision
	// digests is Digest's: its buffers and collections' sums, kept from
	// one digest to the next.
	digests grouper
	// text holds the strings of the plan items' and provisions' keys and
	// collections; resolved the registry entries made ready, which
	// Reset keeps.
	text     texts
	resolved resolvedCache
}

// Reset readies the arena for other compositions: the messages it made are
// cleared, to be made again, and the strings of their keys overwritten.
// Call it only once nothing reads the compositions made with it, nor
// anything taken from them.
func (a *Arena) Reset() {
	a.items = reset(a.items)
	a.buckets = reset(a.buckets)
	a.keys = reset(a.keys)
	a.verbs = reset(a.verbs)
	a.plans = reset(a.plans)
	a.collects = reset(a.collects)
	a.provisions = reset(a.provisions)
	a.text.reset()
}

// Digest returns Digest(c), made in buffers the arena keeps from one
// digest to the next.
func (a *Arena) Digest(c *provisionerv1.ComposeResponse) string {
	a.digests.reset()
	return a.digests.digest(c)
}

func reset[T any](arr []T) []T {
	clear(arr)
	return arr[:0]
}

// reserve makes room for a composition of needs needs without replacing
// an array midway: an array replaced whole holds what came before it and
// the room for this one, so that the arena, reset, holds the next
// composition of that size in the same arrays.
func (a *Arena) reserve(needs int) {
	a.items = room(a.items, needs)
	a.buckets = room(a.buckets, needs)
	a.keys = room(a.keys, needs)
}

// reserveCollected makes room for items collected items, as reserve does.
func (a *Arena) reserveCollected(items int) { a.collects = room(a.collects, items) }

func room[T any](arr []T, n int) []T {
	if cap(arr)-len(arr) >= n {
		return arr
	}
	return make([]T, 0, len(arr)+n)
}

// next returns a new element of an array, which never grows: the elements
// handed out must not move. A full one is replaced by one twice its size,
// so that an array not reserved (provisions) soon holds a composition's.
func next[T any](arr *[]T) *T {
	if len(*arr) == cap(*arr) {
		*arr = make([]T, 0, max(2*cap(*arr), 16))
	}
	*arr = (*arr)[:len(*arr)+1]
	return &(*arr)[len(*arr)-1]
}

func (a *Arena) item() *provisionerv1.PlanItem { return next(&a.items) }

func (a *Arena) provision() *provisionerv1.Provision { return next(&a.provisions) }

func (a *Arena) plan() *provisionerv1.ModulePlan { return next(&a.plans) }

func (a *Arena) verb(verb *provisionerv1.VerbSource) *provisionerv1.PlanItem_Verb {
	v := next(&a.verbs)
	v.Verb = verb
	return v
}

func (a *Arena) bucketKey(bucket, key string) *provisionerv1.PlanItem_Bucket {
	k := next(&a.keys)
	k.Bucket, k.Key = bucket, key
	b := next(&a.buckets)
	b.Bucket = k
	return b
}

// collected returns a collection item as a plan item lists it.
func (a *Arena) collected(it *provisionerv1.CollectRecord) *provisionerv1.CollectedItem {
	c := next(&a.collects)
	c.Contributor, c.Item, c.Revision = it.GetContributor(), it.GetItem(), it.GetRevision()
	return c
}

// texts makes strings of bytes in an array it reuses once reset, rather
// than an allocation a string: a plan item's key was more than half of a
// composition's allocations. The strings are valid until the reset, as
// the messages of an Arena are. A full array is replaced by one twice its
// size, without copying it (its strings stay where they are), so that
// after a reset the array soon holds a whole composition's; the zero texts
// is ready, and a nil one makes strings of their own.
type texts struct{ buf []byte }

func (t *texts) string(b []byte) string {
	if t == nil || len(b) == 0 {
		return string(b)
	}
	if cap(t.buf)-len(t.buf) < len(b) {
		t.buf = make([]byte, 0, max(2*cap(t.buf), len(b), 4096))
	}
	start := len(t.buf)
	t.buf = append(t.buf, b...)
	return unsafe.String(&t.buf[start], len(b))
}

// reset readies the array for strings again: those made are overwritten.
func (t *texts) reset() { t.buf = t.buf[:0] }

package mirror

import (
	"cmp"
	"context"
	"iter"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"unsafe"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Entry is one key of a bucket as a read of the copy sees it: its decoded
// record or, for a key out of the bucket's shape, the report of it. Entries
// are shared by every answer that reads them, and never changed. The copy
// holds a well-formed key as its bytes alone (see slot): its entry is made
// when a read asks for its group, and kept while the group is unchanged and
// among the groups read last (viewLimit).
type Entry[R proto.Message] struct {
	Key string
	// Record is the decoded value; the zero R when Malformed is set.
	Record R
	// Malformed reports a key out of shape or a value that does not decode.
	Malformed *provisionerv1.MalformedKey
	// size is the value's size, counted against the node's budget; zero
	// for a key held only as over the budget.
	size int32
	// overBudget says the key is not held: its node was over its budget.
	overBudget bool
	// revision is the value's: the bucket holds its message while the copy
	// holds the key.
	revision uint64
}

// Tokens returns the key's tokens: what filters read of a malformed key.
func (e *Entry[R]) Tokens() []string { return strings.Split(e.Key, ".") }

// slot is a well-formed key held: one string, the key then the value, and
// the value's revision. With its share of the group's slice, some 120
// bytes a key on a mesh of small values, against some 440 for the decoded
// records; values are decoded when a group is read (Copy.Group).
type slot struct {
	kv       string
	keyLen   int32
	revision uint64
}

func (s slot) key() string   { return s.kv[:s.keyLen] }
func (s slot) value() string { return s.kv[s.keyLen:] }

func bySlotKey(a, b slot) int { return strings.Compare(a.key(), b.key()) }

// maxTail bounds the keys a group takes out of order while its copy
// loads: past it they are sorted into the others. A key is then found by a
// binary search and a short scan, and a load in any order costs a merge
// every maxTail keys rather than a move of half the group every key.
const maxTail = 32

// group holds the keys that share a first token: a node's keys, or one kind
// of the registry.
type group[R proto.Message] struct {
	// slots are the well-formed keys held: in key order up to sorted, then
	// (while the copy loads) at most maxTail in the order they came. odd
	// are the others, malformed or over the budget, each with its entry.
	slots  []slot
	sorted int
	odd    map[string]*Entry[R]
	// kept and bytes count the keys held (of slots, and of odd the
	// malformed values) and their values' size, which the budget bounds.
	kept, bytes int
	// malformed counts the keys of odd reported as malformed (out of
	// shape, or over the budget): the others are records.
	malformed int
	// refused are the keys over the budget that are not even listed (past
	// maxListedOverBudget), by their hash, with the revision of their
	// value: a delete of one of them, or its admission, is counted exactly,
	// for a few bytes a key.
	refused map[uint64]uint64
	// changedAt is the revision of the group's last change.
	changedAt uint64
	// oldest is the least revision of the group's keys, held or not; zero
	// while it is to be found again (oldestOf).
	oldest uint64
	// gen is the copy's generation at the group's last change: unlike
	// revisions, generations never repeat, even when a new watcher brings
	// older revisions again.
	gen uint64
	// view is the group's entries in key order, made on the first read
	// after a change; nil while stale or dropped to bound the memory.
	view atomic.Pointer[view[R]]
	// stale is the view a change made stale, until the next view kept
	// replaces it or the view cache drops it: that view reuses its entries
	// of the values still held, so that a node read after one write decodes
	// one value, not all of them.
	stale atomic.Pointer[view[R]]
}

// view is a group's entries in key order, as a read sees them.
type view[R proto.Message] struct {
	entries []*Entry[R]
	// alive bounds the entries that entries keep from being collected. A
	// view's values are decoded together, in one allocation for their
	// entries and one for their records, and an entry reused by a later
	// view keeps its whole allocation alive.
	alive int
}

func newGroup[R proto.Message]() *group[R] { return &group[R]{} }

// invalidate makes the group's view stale: the next read makes another.
func (g *group[R]) invalidate() {
	if g.view.Load() == nil {
		return // no needless atomic swap while the copy loads
	}
	if v := g.view.Swap(nil); v != nil {
		g.stale.Store(v)
	}
}

// listed returns how many keys the group lists: held, or reported.
func (g *group[R]) listed() int { return len(g.slots) + len(g.odd) }

// find returns the index of key's slot, or -1.
func (g *group[R]) find(key string) int {
	i, found := slices.BinarySearchFunc(g.slots[:g.sorted], key, func(s slot, key string) int { return strings.Compare(s.key(), key) })
	if found {
		return i
	}
	for i := g.sorted; i < len(g.slots); i++ {
		if g.slots[i].key() == key {
			return i
		}
	}
	return -1
}

// insert holds a slot whose key the group does not have: in its place
// once the copy is loaded, else at the tail, merged in when it is full.
func (g *group[R]) insert(s slot, loaded bool) {
	if !loaded || g.sorted < len(g.slots) {
		g.slots = append(g.slots, s)
		if len(g.slots)-g.sorted > maxTail || loaded {
			g.mergeTail()
		}
		return
	}
	i, _ := slices.BinarySearchFunc(g.slots, s.key(), func(s slot, key string) int { return strings.Compare(s.key(), key) })
	g.slots = slices.Insert(g.slots, i, s)
	g.sorted++
}

// mergeTail sorts the tail into the slots in key order, in place.
func (g *group[R]) mergeTail() {
	if g.sorted == len(g.slots) {
		return
	}
	tail := slices.Clone(g.slots[g.sorted:])
	slices.SortFunc(tail, bySlotKey)
	// From the back: the largest of the sorted part and of the tail goes
	// last, into room the tail left.
	i, j, k := g.sorted-1, len(tail)-1, len(g.slots)-1
	for j >= 0 {
		if i >= 0 && bySlotKey(g.slots[i], tail[j]) > 0 {
			g.slots[k] = g.slots[i]
			i--
		} else {
			g.slots[k] = tail[j]
			j--
		}
		k--
	}
	g.sorted = len(g.slots)
}

// removeSlot takes out the slot at i.
func (g *group[R]) removeSlot(i int) {
	if i < g.sorted {
		g.slots = slices.Delete(g.slots, i, i+1)
		g.sorted--
		return
	}
	last := len(g.slots) - 1
	g.slots[i] = g.slots[last]
	g.slots[last] = slot{}
	g.slots = g.slots[:last]
}

// Copy is the watched copy of one bucket, grouped by the key's first token.
// Each value is checked as it arrives (a key out of shape, or a value that
// does not decode, is reported as malformed), held as its bytes, and
// decoded when its group is read.
type Copy[R proto.Message] struct {
	bucket string
	decode func(key string, value []byte, revision uint64) (R, error)
	// check says why a value arriving is malformed, or nil: what decode
	// says, without keeping what it decodes.
	check func(key, value string) error
	// recordsOf returns what decodes n values that decode accepted, for one
	// view: it may read them in place, keep windows on them and on their
	// keys, and allocate the n records at once, or make them in reuse's
	// arrays when it is not nil.
	recordsOf func(n int, reuse *recordBuffers) func(key, value string, revision uint64) R
	loaded    chan struct{} // closed once the first watcher's initial values are in
	ready     atomic.Bool   // loaded, as one atomic load
	once      sync.Once
	behind    atomic.Bool // a watcher is catching up: the copy may lag the bucket

	mu       sync.RWMutex
	groups   map[string]*group[R]
	revision uint64
	// records and malformed are the sums of the groups' records and
	// malformed keys, kept as they change (Counts).
	records, malformed int
	// reached is revision, for readers that need nothing else: one atomic
	// load rather than the lock.
	reached atomic.Uint64
	gen     uint64 // counts the changes applied
	// changes are the groups changed after generation changesFrom, the
	// first token of one a change, in order, logged once the copy is
	// loaded: Changed reads what changed since it last looked, not every
	// group. Past changesLimit the log starts again, and a reader from
	// before it walks every group.
	changes     []string
	changesFrom uint64
	advanced    chan struct{} // closed and replaced when revision moves and waited is set
	// waited says a WaitFor holds advanced: only then is it closed and
	// made anew, not for every change of a loading copy.
	waited atomic.Bool
	// views bounds the groups' views kept.
	views viewCache
	// moved, when set, is sent to (without waiting) whenever a group
	// changes: Mirror.Moved.
	moved chan<- struct{}
	// holds, when set, says which groups (nodes) the copy holds: the keys
	// of any other move its revision only (Mirror.SetHolds,
	// Watchers.Hold).
	holds atomic.Pointer[func(first string) bool]

	// budget bounds what one group (one node) may hold; onBudget hears
	// when a group goes over it or comes back under.
	budget   Budget
	onBudget func(Excess)
	overSet  map[string]*Excess // groups over their budget, by first token
	// readmit are the groups that made room under their budget while keys
	// of theirs were not held; readmitWanted says there are some.
	readmit       map[string]struct{}
	readmitWanted chan struct{}
}

// NewCopy returns an empty copy of bucket whose values decode is given.
func NewCopy[R proto.Message](bucket string, decode func(key string, value []byte, revision uint64) (R, error)) *Copy[R] {
	c := newCopy(bucket, decode, func(int, *recordBuffers) func(key, value string, revision uint64) R {
		return func(key, value string, revision uint64) R {
			r, _ := decode(key, []byte(value), revision)
			return r
		}
	})
	c.check = func(key, value string) error {
		_, err := decode(key, []byte(value), 0)
		return err
	}
	return c
}

// newCopy returns an empty copy whose views decode with recordsOf, faster
// than decode, the values decode accepted.
func newCopy[R proto.Message](bucket string, decode func(key string, value []byte, revision uint64) (R, error), recordsOf func(n int, reuse *recordBuffers) func(key, value string, revision uint64) R) *Copy[R] {
	return &Copy[R]{
		bucket:    bucket,
		decode:    decode,
		recordsOf: recordsOf,
		views:     viewCache{limit: viewLimit},
		loaded:    make(chan struct{}),
		groups:    map[string]*group[R]{},
		advanced:  make(chan struct{}),

		readmitWanted: make(chan struct{}, 1),
	}
}

// Bucket returns the name of the bucket copied.
func (c *Copy[R]) Bucket() string { return c.bucket }

// Loaded is closed once the copy holds the bucket's initial values.
func (c *Copy[R]) Loaded() <-chan struct{} { return c.loaded }

// Ready reports whether the copy holds the bucket's initial values.
func (c *Copy[R]) Ready() bool { return c.ready.Load() }

// Behind reports whether the copy is known to lag the bucket: its watcher
// was lost and is catching up.
func (c *Copy[R]) Behind() bool { return c.behind.Load() }

// MarkLoaded says the copy holds the bucket's initial values.
func (c *Copy[R]) MarkLoaded() {
	c.once.Do(func() {
		c.mu.Lock()
		for _, g := range c.groups {
			g.mergeTail()
			// The slots grew by doubling: what the load left is kept
			// without the room it did not use.
			if cap(g.slots) > len(g.slots)+len(g.slots)/8 {
				g.slots = slices.Clone(g.slots)
			}
		}
		c.ready.Store(true)
		c.mu.Unlock()
		close(c.loaded)
	})
}

// setMoved names the channel told of the copy's groups changing. Call it
// before the copy is applied to.
func (c *Copy[R]) setMoved(moved chan<- struct{}) { c.moved = moved }

// setBehind records whether the copy may lag the bucket.
func (c *Copy[R]) setBehind(behind bool) { c.behind.Store(behind) }

// Revision returns the revision the copy has reached.
func (c *Copy[R]) Revision() uint64 { return c.reached.Load() }

// WaitFor returns true once the copy has reached revision, or false when
// ctx is done first.
func (c *Copy[R]) WaitFor(ctx context.Context, revision uint64) bool {
	for {
		c.mu.RLock()
		c.waited.Store(true)
		reached, advanced := c.revision >= revision, c.advanced
		c.mu.RUnlock()
		if reached {
			return true
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return false
		}
	}
}

// Apply takes one change into the copy: a put, or a delete or purge. One
// goroutine applies a copy's changes (its watcher, or Load).
func (c *Copy[R]) Apply(key string, value []byte, revision uint64, deleted bool) {
	c.apply(key, value, revision, deleted, true)
}

// fillIn takes in a key's last value read apart from the watcher (a Hold's
// read), which may be ahead of the watcher: the copy's revision stays,
// lest the watcher's next changes be taken for applied.
func (c *Copy[R]) fillIn(key string, value []byte, revision uint64) {
	c.apply(key, value, revision, false, false)
}

// apply is Apply; advance moves the copy's revision to the change's.
func (c *Copy[R]) apply(key string, value []byte, revision uint64, deleted, advance bool) {
	first, _, _ := strings.Cut(key, ".")
	if !c.holdsGroup(first) {
		if advance {
			c.mu.Lock()
			c.advanceTo(revision)
			c.mu.Unlock()
		}
		return
	}
	var odd *Entry[R]
	var held slot
	if !deleted {
		// The key given is often a window on a longer string (a message's
		// subject): the copy holds a string of its own, the key then the
		// value, and what it reads of either is a window on it.
		if c.Fits(first, key, len(value)) {
			kv := key + string(value)
			key = kv[:len(key)]
			if err := c.check(key, kv[len(key):]); err != nil {
				odd = &Entry[R]{Key: key, size: int32(len(value)), revision: revision,
					Malformed: &provisionerv1.MalformedKey{Bucket: c.bucket, Key: key, Reason: err.Error(), Revision: revision}}
			} else {
				held = slot{kv: kv, keyLen: int32(len(key)), revision: revision}
			}
		} else {
			key = strings.Clone(key)
			odd = c.overBudgetEntry(key, revision)
		}
		first = key[:len(first)]
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	loaded := c.ready.Load() // set under c.mu, once the tails are merged
	if advance {
		c.advanceTo(revision)
	}
	g := c.groups[first]
	if g == nil {
		if deleted {
			return
		}
		g = newGroup[R]()
		c.groups[first] = g
	}
	c.gen++
	g.changedAt, g.gen = revision, c.gen
	c.logChange(first)
	g.invalidate()
	records, malformed := g.counts()
	freed := g.remove(key)
	switch {
	case odd != nil:
		g.addOdd(key, odd)
	case !deleted:
		g.addHeld(held, loaded)
	}
	c.recount(g, records, malformed)
	if freed {
		c.wantReadmit(first, g)
	}
	c.checkBudget(first, g)
	if g.empty() {
		// A node that left leaves nothing behind: its stamp is then the
		// empty group's, and what is answered of it is the empty answer.
		delete(c.groups, first)
	}
}

// advance moves the copy's revision to revision, if later: it holds every
// change up to it of the keys it holds.
func (c *Copy[R]) advance(revision uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.advanceTo(revision)
}

// advanceTo moves the copy's revision to revision, if later, and wakes its
// waiters. c.mu is held.
func (c *Copy[R]) advanceTo(revision uint64) {
	if revision > c.revision {
		c.revision = revision
		c.reached.Store(revision)
		if c.waited.Swap(false) {
			close(c.advanced)
			c.advanced = make(chan struct{})
		}
	}
}

// counts returns the group's records and malformed keys listed.
func (g *group[R]) counts() (records, malformed int) {
	return g.listed() - g.malformed, g.malformed
}

// recount takes a group's change into the copy's counts: records and
// malformed are the group's counts before it. The caller holds c.mu.
func (c *Copy[R]) recount(g *group[R], records, malformed int) {
	r, m := g.counts()
	c.records += r - records
	c.malformed += m - malformed
}

// Counts returns what the copy holds, counted as it changes: its records
// (keys whose value decodes), its malformed keys listed (out of shape, or
// over a node's budget), its groups (the nodes of a state bucket, the kinds
// of the registry), and the revision it has reached.
func (c *Copy[R]) Counts() (records, malformed, groups int, revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.records, c.malformed, len(c.groups), c.revision
}

// remove takes key out of the group, held, listed or refused, and reports
// whether it was held: its room under the budget is free now.
func (g *group[R]) remove(key string) (held bool) {
	if i := g.find(key); i >= 0 {
		old := g.slots[i]
		g.removeSlot(i)
		g.kept--
		g.bytes -= len(old.value())
		if old.revision == g.oldest {
			g.oldest = 0
		}
		return true
	}
	if old := g.odd[key]; old != nil {
		g.forget(old)
		delete(g.odd, key)
		if old.revision == g.oldest {
			g.oldest = 0
		}
		return !old.overBudget
	}
	h := refusedHash(key)
	if revision, ok := g.refused[h]; ok {
		delete(g.refused, h)
		if revision == g.oldest {
			g.oldest = 0
		}
	}
	return false
}

// addHeld holds a well-formed key.
func (g *group[R]) addHeld(s slot, loaded bool) {
	g.seen(s.revision)
	g.insert(s, loaded)
	g.kept++
	g.bytes += len(s.value())
}

// addOdd puts the entry of a key malformed or over the budget in the group:
// listed, or, once maxListedOverBudget are listed, refused (counted, not
// listed: the listing is bounded too).
func (g *group[R]) addOdd(key string, e *Entry[R]) {
	g.seen(e.revision)
	if e.overBudget && g.listed()-g.kept >= maxListedOverBudget {
		if g.refused == nil {
			g.refused = map[uint64]uint64{}
		}
		g.refused[refusedHash(key)] = e.Malformed.GetRevision()
		return
	}
	if g.odd == nil {
		g.odd = map[string]*Entry[R]{}
	}
	g.odd[key] = e
	if e.Malformed != nil {
		g.malformed++
	}
	if !e.overBudget {
		g.kept++
		g.bytes += int(e.size)
	}
}

// seen takes a new key's revision into the group's oldest.
func (g *group[R]) seen(revision uint64) {
	if g.oldest != 0 || g.empty() {
		g.oldest = min(g.oldest-1, revision-1) + 1 // zero is unknown: taken as the highest
	}
}

// empty reports whether the group holds, lists and refuses nothing.
func (g *group[R]) empty() bool { return g.listed() == 0 && len(g.refused) == 0 }

// holdsGroup reports whether the copy holds the keys of group first.
func (c *Copy[R]) holdsGroup(first string) bool {
	holds := c.holds.Load()
	return holds == nil || (*holds)(first)
}

// setHolds has the copy hold the groups holds says yes to from now on.
func (c *Copy[R]) setHolds(holds func(first string) bool) { c.holds.Store(&holds) }

// dropUnheld drops the groups the copy no longer holds (Watchers.Hold).
func (c *Copy[R]) dropUnheld() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for first, g := range c.groups {
		if c.holdsGroup(first) {
			continue
		}
		records, malformed := g.counts()
		var gone []string
		for _, sl := range g.slots {
			gone = append(gone, sl.key())
		}
		for key := range g.odd {
			gone = append(gone, key)
		}
		for _, key := range gone {
			g.remove(key)
		}
		clear(g.refused)
		g.invalidate()
		c.gen++
		g.changedAt, g.gen = c.revision, c.gen
		c.logChange(first)
		c.recount(g, records, malformed)
		// The node is not back within its budget, only no longer held
		// here: it leaves the report, and nothing is said or read again.
		delete(c.overSet, first)
		delete(c.readmit, first)
		delete(c.groups, first)
	}
}

// keepOnly drops the keys not in live of the groups read says yes to (nil:
// every group): they were deleted while no watcher ran.
func (c *Copy[R]) keepOnly(live map[string]bool, read func(first string) bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	liveRefused := c.liveRefused(live)
	for first, g := range c.groups {
		if read != nil && !read(first) {
			continue
		}
		records, malformed := g.counts()
		var gone []string
		for _, sl := range g.slots {
			if !live[sl.key()] {
				gone = append(gone, sl.key())
			}
		}
		for key := range g.odd {
			if !live[key] {
				gone = append(gone, key)
			}
		}
		for _, key := range gone {
			g.remove(key)
			g.invalidate()
			c.gen++
			g.changedAt, g.gen = c.revision, c.gen
			c.logChange(first)
		}
		for h := range g.refused {
			if _, ok := liveRefused[h]; !ok {
				delete(g.refused, h)
			}
		}
		c.recount(g, records, malformed)
		g.oldest = 0 // found again when asked
		c.checkBudget(first, g)
		if g.empty() {
			delete(c.groups, first)
		}
	}
}

// liveRefused returns the hashes of the live keys of the groups that refuse
// keys: the refused keys a full read delivered.
func (c *Copy[R]) liveRefused(live map[string]bool) map[uint64]struct{} {
	refusing := false
	for _, g := range c.groups {
		refusing = refusing || len(g.refused) > 0
	}
	if !refusing {
		return nil
	}
	out := map[uint64]struct{}{}
	for key := range live {
		first, _, _ := strings.Cut(key, ".")
		if g := c.groups[first]; g != nil && len(g.refused) > 0 {
			out[refusedHash(key)] = struct{}{}
		}
	}
	return out
}

// inOrder returns the group's slots in key order: its slots themselves,
// or while its copy loads a sorted copy of them.
func (g *group[R]) inOrder() []slot {
	if g.sorted == len(g.slots) {
		return g.slots
	}
	s := slices.Clone(g.slots)
	slices.SortFunc(s, bySlotKey)
	return s
}

// viewOf returns the group's entries in key order, decoding the values held
// if they changed since the last read; keep says the view is kept for the
// next reads. Of the values the stale view decoded, those still held are
// not decoded again. The caller holds c.mu for reading.
func (c *Copy[R]) viewOf(g *group[R], keep bool) []*Entry[R] {
	return c.viewIn(g, keep, nil)
}

// viewIn is viewOf, making the view in scratch's arrays when it is not nil
// (and keep is false): the view is then scratch's until its next read.
func (c *Copy[R]) viewIn(g *group[R], keep bool, scratch *Scratch[R]) []*Entry[R] {
	if v := g.view.Load(); v != nil {
		return v.entries
	}
	slots := g.inOrder()
	var odd []*Entry[R]
	for _, e := range g.odd {
		odd = append(odd, e)
	}
	slices.SortFunc(odd, byKey)
	stale := g.stale.Load()
	reuse, decode := reusable(stale, slots)
	v := &view[R]{alive: len(slots)}
	if reuse != nil {
		v.alive = stale.alive + decode
	}
	var made []Entry[R]
	var record func(key, value string, revision uint64) R
	if scratch != nil && !keep {
		v.entries = cleared(&scratch.entries, len(slots)+len(odd))
		if decode > 0 {
			made, record = cleared(&scratch.made, decode), c.recordsOf(decode, &scratch.records)
		}
	} else {
		v.entries = make([]*Entry[R], 0, len(slots)+len(odd))
		if decode > 0 {
			made, record = make([]Entry[R], 0, decode), c.recordsOf(decode, nil)
		}
	}
	for i, s := range slots {
		for len(odd) > 0 && odd[0].Key < s.key() {
			v.entries, odd = append(v.entries, odd[0]), odd[1:]
		}
		if reuse != nil && reuse[i] != nil {
			v.entries = append(v.entries, reuse[i])
			continue
		}
		key, value := s.key(), s.value()
		// made never grows past its capacity: its elements do not move.
		made = append(made, Entry[R]{Key: key, Record: record(key, value, s.revision), size: int32(len(value)), revision: s.revision})
		v.entries = append(v.entries, &made[len(made)-1])
	}
	v.entries = append(v.entries, odd...)
	if keep && g.view.CompareAndSwap(nil, v) {
		g.stale.CompareAndSwap(stale, nil)
		c.views.kept(g, v, len(v.entries))
	}
	return v.entries
}

// reusable returns, for each slot, the stale view's entry of the value it
// holds, or nil where the value is to be decoded, and how many are. It
// reuses none when the view made would keep more than twice its values
// alive: else a node writing most of its keys between reads could make
// each view keep one more decoding alive. The bound is the stale view's
// plus what is decoded, which overcounts what is no longer reused: a view
// is decoded whole again after as many values decoded alone as it holds.
func reusable[R proto.Message](stale *view[R], slots []slot) (reuse []*Entry[R], decode int) {
	if stale == nil {
		return nil, len(slots)
	}
	old := stale.entries
	reuse = make([]*Entry[R], len(slots))
	j := 0
	for i, s := range slots {
		// Both in key order: the stale entry of an unchanged value is met
		// in step, and a key is compared only past a change.
		for j < len(old) && !old[j].holds(s) && old[j].Key < s.key() {
			j++
		}
		if j < len(old) && old[j].holds(s) {
			reuse[i] = old[j]
			j++
			continue
		}
		decode++
	}
	if stale.alive+decode > 2*len(slots) {
		return nil, len(slots)
	}
	return reuse, decode
}

// holds reports whether e was decoded from the value s holds: from the very
// string the copy keeps, which is never changed, and which a new put
// replaces with another. Revisions cannot tell: a bucket deleted and made
// again writes its revisions over. A malformed key's entry holds no slot's.
func (e *Entry[R]) holds(s slot) bool {
	return len(e.Key) == int(s.keyLen) && unsafe.StringData(e.Key) == unsafe.StringData(s.kv)
}

// Group returns the entries whose key's first token is first, in key order,
// the revision of the group's last change, and the copy's revision.
func (c *Copy[R]) Group(first string) (entries []*Entry[R], changedAt, revision uint64) {
	return c.group(first, true)
}

// GroupOnce returns what Group returns, but keeps no view it decodes for
// the next reads: for a reader of every group in turn, such as the plans
// writer, whose views would push out those that requests read again and
// hold as many as the bound allows.
func (c *Copy[R]) GroupOnce(first string) (entries []*Entry[R], changedAt, revision uint64) {
	return c.group(first, false)
}

// GroupInto returns what GroupOnce returns, decoded in scratch's arrays:
// the entries and their records are valid until scratch's next read. A
// view kept already (a request read the group) is returned as it is.
func (c *Copy[R]) GroupInto(first string, scratch *Scratch[R]) (entries []*Entry[R], changedAt, revision uint64) {
	return c.groupIn(first, false, scratch)
}

func (c *Copy[R]) group(first string, keep bool) (entries []*Entry[R], changedAt, revision uint64) {
	return c.groupIn(first, keep, nil)
}

func (c *Copy[R]) groupIn(first string, keep bool, scratch *Scratch[R]) (entries []*Entry[R], changedAt, revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if g := c.groups[first]; g != nil {
		entries, changedAt = c.viewIn(g, keep, scratch), g.changedAt
	}
	return entries, changedAt, c.revision
}

// Values calls each with the key and the value's bytes of each key the
// group first holds well formed, in key order, and returns the copy's
// revision: for a reader of a field or two of each value, which decodes
// nothing else and keeps no view. The strings are the copy's, never
// changed: each may keep windows on them. each runs under the copy's read
// lock, and must not call the copy.
func (c *Copy[R]) Values(first string, each func(key, value string)) (revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if g := c.groups[first]; g != nil {
		for _, s := range g.inOrder() {
			each(s.key(), s.value())
		}
	}
	return c.revision
}

// All returns every entry of the copy in key order, and the copy's revision.
// The groups' views it makes are not kept: every group's would be the whole
// copy decoded.
func (c *Copy[R]) All() (entries []*Entry[R], revision uint64) {
	c.mu.RLock()
	groups := make([][]*Entry[R], 0, len(c.groups))
	n := 0
	for _, g := range c.groups {
		if s := c.viewOf(g, false); len(s) > 0 {
			groups = append(groups, s)
			n += len(s)
		}
	}
	revision = c.revision
	c.mu.RUnlock()

	// Groups' well-formed keys never interleave (each starts with the
	// group's token and a dot): sorting groups by their first key and
	// concatenating gives key order, but for malformed keys such as a lone
	// token, which a last check catches.
	slices.SortFunc(groups, func(a, b []*Entry[R]) int { return cmp.Compare(a[0].Key, b[0].Key) })
	all := make([]*Entry[R], 0, n)
	for _, s := range groups {
		all = append(all, s...)
	}
	if !slices.IsSortedFunc(all, byKey) {
		slices.SortFunc(all, byKey)
	}
	return all, revision
}

func byKey[R proto.Message](a, b *Entry[R]) int { return cmp.Compare(a.Key, b.Key) }

// After returns the entries whose keys sort after after, in key order, as
// All lists them, decoding each group only once it is reached (no view
// kept): a page of every node's keys decodes the nodes it lists, not every
// node, as All would.
//
// A group's keys are its first token alone, or begin with it and a dot,
// and no token holds a dot: the keys that begin with "t." sort together,
// apart from any other group's, and a key "t" sorts before every key that
// begins with it. So the groups, each as its run of keys "t." and its key
// "t" if it has one, sorted by those prefixes, list every key in order.
func (c *Copy[R]) After(after string) iter.Seq[*Entry[R]] {
	type run struct {
		prefix, first string
		alone         bool // the key that is the first token alone
	}
	return func(yield func(*Entry[R]) bool) {
		c.mu.RLock()
		runs := make([]run, 0, len(c.groups))
		for first, g := range c.groups {
			alone := 0
			if g.find(first) >= 0 || g.odd[first] != nil {
				alone = 1
				runs = append(runs, run{prefix: first, first: first, alone: true})
			}
			if g.listed() > alone {
				runs = append(runs, run{prefix: first + ".", first: first})
			}
		}
		c.mu.RUnlock()
		slices.SortFunc(runs, func(a, b run) int { return strings.Compare(a.prefix, b.prefix) })
		for _, r := range runs {
			if r.alone && r.prefix <= after || !r.alone && after >= r.prefix && !strings.HasPrefix(after, r.prefix) {
				continue // every key of the run sorts before after, or is it
			}
			c.mu.RLock()
			var entries []*Entry[R]
			if g := c.groups[r.first]; g != nil {
				entries = c.viewOf(g, false)
			}
			c.mu.RUnlock()
			for _, e := range entries {
				if (e.Key == r.first) == r.alone && e.Key > after && !yield(e) {
					return
				}
			}
		}
	}
}

// liveKeys returns how many keys the copy has (held, listed or refused
// over a budget), each a message of the bucket, the least of their
// revisions (zero when there are none), and the copy's revision.
func (c *Copy[R]) liveKeys() (n int, oldest, revision uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	revision = c.revision
	for _, g := range c.groups {
		n += g.listed() + len(g.refused)
		if o := g.oldestOf(); o > 0 && (oldest == 0 || o < oldest) {
			oldest = o
		}
	}
	return n, oldest, revision
}

// oldestOf returns the least revision of the group's keys, finding it again
// if a key that had it left. The caller holds c.mu.
func (g *group[R]) oldestOf() uint64 {
	if g.oldest == 0 && !g.empty() {
		o := uint64(0)
		least := func(revision uint64) {
			if o == 0 || revision < o {
				o = revision
			}
		}
		for _, s := range g.slots {
			least(s.revision)
		}
		for _, e := range g.odd {
			least(e.revision)
		}
		for _, revision := range g.refused {
			least(revision)
		}
		g.oldest = o
	}
	return g.oldest
}

// Empty reports whether the copy holds no key.
func (c *Copy[R]) Empty() bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	for _, g := range c.groups {
		if g.listed() > 0 {
			return false
		}
	}
	return true
}

// WaitFilled returns true once the copy holds a key, or false when ctx is
// done first.
func (c *Copy[R]) WaitFilled(ctx context.Context) bool {
	for {
		c.mu.RLock()
		c.waited.Store(true)
		advanced := c.advanced
		c.mu.RUnlock()
		if !c.Empty() {
			return true
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return false
		}
	}
}

// Stamp identifies what the group first holds now (every group, for an
// empty first): it changes whenever the group does, and never takes a value
// it had before but zero, the stamp of a group that holds nothing. It
// returns the copy's revision too.
func (c *Copy[R]) Stamp(first string) (stamp, revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if first == "" {
		return c.gen, c.revision
	}
	if g := c.groups[first]; g != nil {
		return g.gen, c.revision
	}
	return 0, c.revision
}

// Get returns the record of a key whose first token is first, if the copy
// holds it and it is not malformed.
func (c *Copy[R]) Get(first, key string) (R, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var zero R
	g := c.groups[first]
	if g == nil {
		return zero, false
	}
	view := c.viewOf(g, true)
	i, found := slices.BinarySearchFunc(view, key, func(e *Entry[R], key string) int { return cmp.Compare(e.Key, key) })
	if !found || view[i].Malformed != nil {
		return zero, false
	}
	return view[i].Record, true
}

// viewLimit bounds the entries of the views a copy keeps: about 350 bytes
// an entry decoded, some 20 MiB whatever the mesh's size (twice that at
// most, through the entries views reuse), for the groups read last (a node
// composed again while unchanged decodes nothing).
const viewLimit = 1 << 16

// viewCache remembers the views kept, the first kept first, and drops the
// oldest when they hold more than limit entries (zero: no limit). A view
// that went stale still counts until its turn comes: the bound is on what
// was decoded lately, which is never less than what is kept.
type viewCache struct {
	limit int
	mu    sync.Mutex
	queue []keptView
	held  int
}

type keptView struct {
	drop func()
	n    int
}

// kept records that g keeps view, and drops the oldest views over the
// limit.
func (v *viewCache) kept(g interface{ dropView(any) }, view any, n int) {
	if v.limit <= 0 {
		return
	}
	v.mu.Lock()
	defer v.mu.Unlock()
	v.queue = append(v.queue, keptView{drop: func() { g.dropView(view) }, n: n})
	v.held += n
	for v.held > v.limit && len(v.queue) > 1 {
		old := v.queue[0]
		v.queue[0] = keptView{}
		v.queue = v.queue[1:]
		v.held -= old.n
		old.drop()
	}
	if cap(v.queue) > 64 && len(v.queue) < cap(v.queue)/4 {
		v.queue = slices.Clone(v.queue)
	}
}

// dropView forgets the group's view if it is still view.
func (g *group[R]) dropView(dropped any) {
	if p, ok := dropped.(*view[R]); ok {
		g.view.CompareAndSwap(p, nil)
		g.stale.CompareAndSwap(p, nil)
	}
}

// Changed returns the first tokens of the groups changed after the copy's
// generation gen (every group, for gen zero), and its generation now: a
// reader that keeps the generation learns what changed since it last
// looked. A group emptied since is not among them (Stamp says zero).
func (c *Copy[R]) Changed(gen uint64) (firsts []string, now uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if gen >= c.gen {
		return nil, c.gen
	}
	if gen >= c.changesFrom {
		// The log: each group once, at its last change, if not emptied.
		for i, first := range c.changes[gen-c.changesFrom:] {
			if g := c.groups[first]; g != nil && g.gen == gen+uint64(i)+1 {
				firsts = append(firsts, first)
			}
		}
		return firsts, c.gen
	}
	for first, g := range c.groups {
		if g.gen > gen {
			firsts = append(firsts, first)
		}
	}
	return firsts, c.gen
}

// changesLimit bounds the change log (Copy.changes): some 50 KB, many
// times what the plans' writer, its one reader, finds between two looks;
// a copy no writer reads starts it again each time it fills.
const changesLimit = 4096

// logChange logs the change that made the copy's generation c.gen, of
// the group first, and tells moved. Every change is one: a key applied
// at a revision the copy had passed (a bucket made again) and a key
// dropped by keepOnly move no revision. c.mu is held.
func (c *Copy[R]) logChange(first string) {
	if c.moved != nil {
		select {
		case c.moved <- struct{}{}:
		default: // one value stands for every change until it is taken
		}
	}
	if !c.ready.Load() || len(c.changes) == changesLimit {
		// A load's changes are read by walking every group: not logged.
		clear(c.changes)
		c.changes, c.changesFrom = c.changes[:0], c.gen
		return
	}
	// A clone: first is a window on the key and value's string, which the
	// log must not keep once the key is gone.
	c.changes = append(c.changes, strings.Clone(first))
}

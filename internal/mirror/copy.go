package mirror

import (
	"cmp"
	"context"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Entry is one key of a bucket as the copy holds it: its decoded record or,
// for a key out of the bucket's shape, the report of it. Entries are shared
// by every answer that reads them, and never changed.
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

// group holds the keys that share a first token: a node's keys, or one kind
// of the registry.
type group[R proto.Message] struct {
	byKey map[string]*Entry[R]
	// held and bytes count the keys held and their values' size, which
	// the budget bounds.
	held, bytes int
	// malformed counts the keys of byKey reported as malformed (out of
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
	// sorted is the group in key order, built on the first read after a
	// change; nil while stale.
	sorted atomic.Pointer[[]*Entry[R]]
}

// Copy is the watched copy of one bucket, grouped by the key's first token.
// Records are decoded once, as they arrive.
type Copy[R proto.Message] struct {
	bucket string
	decode func(key string, value []byte, revision uint64) (R, error)
	loaded chan struct{} // closed once the first watcher's initial values are in
	ready  atomic.Bool   // loaded, as one atomic load
	once   sync.Once
	behind atomic.Bool // a watcher is catching up: the copy may lag the bucket

	mu       sync.RWMutex
	groups   map[string]*group[R]
	revision uint64
	// records and malformed are the sums of the groups' records and
	// malformed keys, kept as they change (Counts).
	records, malformed int
	// reached is revision, for readers that need nothing else: one atomic
	// load rather than the lock.
	reached  atomic.Uint64
	gen      uint64        // counts the changes applied
	advanced chan struct{} // closed and replaced when revision moves and waited is set
	// waited says a WaitFor holds advanced: only then is it closed and
	// made anew, not for every change of a loading copy.
	waited atomic.Bool
	// all is every entry in key order, built on the first unfiltered read
	// after a change; nil while stale.
	all atomic.Pointer[[]*Entry[R]]

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
	return &Copy[R]{
		bucket:   bucket,
		decode:   decode,
		loaded:   make(chan struct{}),
		groups:   map[string]*group[R]{},
		advanced: make(chan struct{}),

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
		c.ready.Store(true)
		close(c.loaded)
	})
}

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
	var e *Entry[R]
	if !deleted {
		// The key given is often a window on a longer string (a message's
		// subject): the copy holds a key of its own, and the record's parts
		// are windows on it.
		key = strings.Clone(key)
	}
	first, _, _ := strings.Cut(key, ".")
	if !deleted {
		if c.fits(first, key, len(value)) {
			e = c.decoded(key, value, revision)
		} else {
			e = c.overBudgetEntry(key, revision)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if revision > c.revision {
		c.revision = revision
		c.reached.Store(revision)
		if c.waited.Swap(false) {
			close(c.advanced)
			c.advanced = make(chan struct{})
		}
	}
	g := c.groups[first]
	if g == nil {
		if deleted {
			return
		}
		g = &group[R]{byKey: map[string]*Entry[R]{}}
		c.groups[first] = g
	}
	c.gen++
	g.changedAt, g.gen = revision, c.gen
	if g.sorted.Load() != nil { // no needless atomic store while loading
		g.sorted.Store(nil)
	}
	if c.all.Load() != nil {
		c.all.Store(nil)
	}
	records, malformed := g.counts()
	freed := g.remove(key)
	if e != nil {
		g.add(key, e)
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

// counts returns the group's records and malformed keys listed.
func (g *group[R]) counts() (records, malformed int) {
	return len(g.byKey) - g.malformed, g.malformed
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
	if old := g.byKey[key]; old != nil {
		g.forget(old)
		delete(g.byKey, key)
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

// add puts an entry in the group: held, listed as over the budget, or, once
// maxListedOverBudget are listed, refused (counted, not listed: the listing
// is bounded too).
func (g *group[R]) add(key string, e *Entry[R]) {
	if g.oldest != 0 || g.empty() {
		g.oldest = min(g.oldest-1, e.revision-1) + 1 // zero is unknown: taken as the highest
	}
	if e.overBudget && len(g.byKey)-g.held >= maxListedOverBudget {
		if g.refused == nil {
			g.refused = map[uint64]uint64{}
		}
		g.refused[refusedHash(key)] = e.Malformed.GetRevision()
		return
	}
	g.byKey[key] = e
	if e.Malformed != nil {
		g.malformed++
	}
	if !e.overBudget {
		g.held++
		g.bytes += int(e.size)
	}
}

// empty reports whether the group holds, lists and refuses nothing.
func (g *group[R]) empty() bool { return len(g.byKey) == 0 && len(g.refused) == 0 }

// decoded returns the entry of a key held in the copy.
func (c *Copy[R]) decoded(key string, value []byte, revision uint64) *Entry[R] {
	e := &Entry[R]{Key: key, size: int32(len(value)), revision: revision}
	record, err := c.decode(key, value, revision)
	if err != nil {
		e.Malformed = &provisionerv1.MalformedKey{Bucket: c.bucket, Key: key, Reason: err.Error(), Revision: revision}
	} else {
		e.Record = record
	}
	return e
}

// keepOnly drops the keys not in live: they were deleted while no watcher
// ran.
func (c *Copy[R]) keepOnly(live map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	liveRefused := c.liveRefused(live)
	for first, g := range c.groups {
		records, malformed := g.counts()
		for key, e := range g.byKey {
			if !live[key] {
				g.forget(e)
				delete(g.byKey, key)
				g.sorted.Store(nil)
				c.all.Store(nil)
				c.gen++
				g.changedAt, g.gen = c.revision, c.gen
			}
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

// sortedOf returns a group's entries in key order, sorting them if they
// changed. The caller holds c.mu for reading; concurrent readers may sort
// twice, harmlessly.
func (g *group[R]) sortedOf() []*Entry[R] {
	if s := g.sorted.Load(); s != nil {
		return *s
	}
	s := make([]*Entry[R], 0, len(g.byKey))
	for _, e := range g.byKey {
		s = append(s, e)
	}
	slices.SortFunc(s, byKey)
	g.sorted.Store(&s)
	return s
}

func byKey[R proto.Message](a, b *Entry[R]) int { return cmp.Compare(a.Key, b.Key) }

// Group returns the entries whose key's first token is first, in key order,
// the revision of the group's last change, and the copy's revision.
func (c *Copy[R]) Group(first string) (entries []*Entry[R], changedAt, revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if g := c.groups[first]; g != nil {
		entries, changedAt = g.sortedOf(), g.changedAt
	}
	return entries, changedAt, c.revision
}

// All returns every entry of the copy in key order, and the copy's revision.
// The order is built once after each change and shared by later reads; it
// is built outside the lock, which the watcher needs.
func (c *Copy[R]) All() (entries []*Entry[R], revision uint64) {
	c.mu.RLock()
	if s := c.all.Load(); s != nil {
		defer c.mu.RUnlock()
		return *s, c.revision
	}
	groups := make([][]*Entry[R], 0, len(c.groups))
	n := 0
	for _, g := range c.groups {
		if s := g.sortedOf(); len(s) > 0 {
			groups = append(groups, s)
			n += len(s)
		}
	}
	gen, revision := c.gen, c.revision
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
	c.mu.Lock()
	if c.gen == gen { // nothing changed meanwhile: later reads share it
		c.all.Store(&all)
	}
	c.mu.Unlock()
	return all, revision
}

// liveKeys returns how many keys the copy has (held, listed or refused
// over a budget), each a message of the bucket, the least of their
// revisions (zero when there are none), and the copy's revision.
func (c *Copy[R]) liveKeys() (n int, oldest, revision uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	revision = c.revision
	for _, g := range c.groups {
		n += len(g.byKey) + len(g.refused)
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
		for _, e := range g.byKey {
			if o == 0 || e.revision < o {
				o = e.revision
			}
		}
		for _, revision := range g.refused {
			if o == 0 || revision < o {
				o = revision
			}
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
		if len(g.byKey) > 0 {
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
	e := g.byKey[key]
	if e == nil || e.Malformed != nil {
		return zero, false
	}
	return e.Record, true
}

// Changed returns the first tokens of the groups changed after the copy's
// generation gen (every group, for gen zero), and its generation now: a
// reader that keeps the generation learns what changed since it last
// looked. A group emptied since is not among them (Stamp says zero).
func (c *Copy[R]) Changed(gen uint64) (firsts []string, now uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.gen == gen {
		return nil, gen
	}
	for first, g := range c.groups {
		if g.gen > gen {
			firsts = append(firsts, first)
		}
	}
	return firsts, c.gen
}

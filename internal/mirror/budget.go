package mirror

import (
	"fmt"
	"hash/maphash"
	"slices"
	"strings"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Budget bounds what the copy holds of one node in one bucket, so that no
// node can grow the server's memory beyond it, whatever it writes. Zero
// fields are unbounded.
type Budget struct {
	// Keys is the most keys held of a node.
	Keys int
	// Bytes is the most value bytes held of a node.
	Bytes int
}

// maxListedOverBudget bounds how many keys over a node's budget are listed
// (as malformed keys, with a reason that names the budget); the rest are
// only counted, so the listing cannot grow without bound either.
const maxListedOverBudget = 100

// Excess describes a node over its budget in one bucket.
type Excess struct {
	Bucket string `json:"bucket"`
	Node   string `json:"node"`
	// Over is true while the node is over its budget; false in the report
	// that it came back under.
	Over bool `json:"-"`
	// Keys and Bytes are what the node has held, at most the budget;
	// Refused is how many of its keys are not held.
	Keys    int `json:"keys"`
	Bytes   int `json:"bytes"`
	Refused int `json:"refused"`
}

// SetBudget sets the budget of each node and the function told when a node
// goes over it or comes back under (called with the copy locked: it must
// not read the copy). Call it before the copy is loaded.
func (c *Copy[R]) SetBudget(b Budget, onChange func(Excess)) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.budget, c.onBudget = b, onChange
}

// Budget returns the budget of each node, as SetBudget set it.
func (c *Copy[R]) Budget() Budget {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.budget
}

// Fits reports whether a put of size bytes to key may be held: its node
// stays within its budget once the key's old value, if held, is replaced.
// The write verbs ask it before they store a put, so that no write is
// acknowledged that the copy would not hold.
func (c *Copy[R]) Fits(first, key string, size int) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.budget == (Budget{}) {
		return true
	}
	keys, bytes := 1, size
	if g := c.groups[first]; g != nil {
		keys, bytes = g.kept+1, g.bytes+size
		if i := g.find(key); i >= 0 {
			keys, bytes = keys-1, bytes-len(g.slots[i].value())
		} else if old := g.odd[key]; old != nil && !old.overBudget {
			keys, bytes = keys-1, bytes-int(old.size)
		}
	}
	return (c.budget.Keys <= 0 || keys <= c.budget.Keys) && (c.budget.Bytes <= 0 || bytes <= c.budget.Bytes)
}

// FitsReplacing reports whether node first stays within its budget once
// every key it holds that starts with prefix is replaced by keys keys of
// bytes value bytes in all: an apply replaces a module's needs so.
func (c *Copy[R]) FitsReplacing(first, prefix string, keys, bytes int) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if c.budget == (Budget{}) {
		return true
	}
	if g := c.groups[first]; g != nil {
		keys, bytes = g.kept+keys, g.bytes+bytes
		for _, s := range g.slots {
			if strings.HasPrefix(s.key(), prefix) {
				keys, bytes = keys-1, bytes-len(s.value())
			}
		}
		for key, old := range g.odd {
			if !old.overBudget && strings.HasPrefix(key, prefix) {
				keys, bytes = keys-1, bytes-int(old.size)
			}
		}
	}
	return (c.budget.Keys <= 0 || keys <= c.budget.Keys) && (c.budget.Bytes <= 0 || bytes <= c.budget.Bytes)
}

// overBudgetEntry reports a key that is not held: its node is over budget.
// The value is neither decoded nor kept.
func (c *Copy[R]) overBudgetEntry(key string, revision uint64) *Entry[R] {
	first, _, _ := strings.Cut(key, ".")
	return &Entry[R]{
		Key:        key,
		overBudget: true,
		revision:   revision,
		Malformed: &provisionerv1.MalformedKey{Bucket: c.bucket, Key: key, Revision: revision, Reason: fmt.Sprintf(
			"not held: node %s is over its budget of %s in this bucket; delete some of its keys, or raise the server's --node-max-keys/--node-max-bytes", first, c.budget)},
	}
}

// String says a budget in a sentence's words.
func (b Budget) String() string {
	var parts []string
	if b.Keys > 0 {
		parts = append(parts, fmt.Sprintf("%d keys", b.Keys))
	}
	if b.Bytes > 0 {
		parts = append(parts, fmt.Sprintf("%d bytes", b.Bytes))
	}
	if len(parts) == 0 {
		return "nothing"
	}
	return strings.Join(parts, " and ")
}

// refusedSeed seeds the hashes of refused keys.
var refusedSeed = maphash.MakeSeed()

// refusedHash is how a refused key is remembered: 64 bits, so that two
// keys of one node collide with a negligible chance.
func refusedHash(key string) uint64 { return maphash.String(refusedSeed, key) }

// forget takes an odd entry out of the group's counts.
func (g *group[R]) forget(e *Entry[R]) {
	if e.Malformed != nil {
		g.malformed--
	}
	if !e.overBudget {
		g.kept--
		g.bytes -= int(e.size)
	}
}

// checkBudget tells onBudget when a group went over its budget or came back
// under. The caller holds c.mu.
func (c *Copy[R]) checkBudget(first string, g *group[R]) {
	refused := g.listed() - g.kept + len(g.refused)
	_, wasOver := c.overSet[first]
	switch {
	case refused > 0:
		x := &Excess{Bucket: c.bucket, Node: first, Over: true, Keys: g.kept, Bytes: g.bytes, Refused: refused}
		if c.overSet == nil {
			c.overSet = map[string]*Excess{}
		}
		c.overSet[first] = x
		if !wasOver && c.onBudget != nil {
			c.onBudget(*x)
		}
	case wasOver:
		delete(c.overSet, first)
		if c.onBudget != nil {
			c.onBudget(Excess{Bucket: c.bucket, Node: first, Keys: g.kept, Bytes: g.bytes})
		}
	}
}

// OverBudget returns the nodes over their budget, by node.
func (c *Copy[R]) OverBudget() []Excess {
	c.mu.RLock()
	defer c.mu.RUnlock()
	out := make([]Excess, 0, len(c.overSet))
	for _, x := range c.overSet {
		out = append(out, *x)
	}
	slices.SortFunc(out, func(a, b Excess) int { return strings.Compare(a.Node, b.Node) })
	return out
}

// wantReadmit records a group that made room under its budget while keys
// of its were not held: the watcher reads them again (Watchers.readmit),
// since the copy kept neither their values nor, for refused keys, their
// names. The caller holds c.mu.
func (c *Copy[R]) wantReadmit(first string, g *group[R]) {
	if g.listed() == g.kept && len(g.refused) == 0 {
		return // nothing waits
	}
	if (c.budget.Keys > 0 && g.kept >= c.budget.Keys) || (c.budget.Bytes > 0 && g.bytes >= c.budget.Bytes) {
		return // no room yet
	}
	if c.readmit == nil {
		c.readmit = map[string]struct{}{}
	}
	c.readmit[first] = struct{}{}
	select {
	case c.readmitWanted <- struct{}{}:
	default:
	}
}

// readmits is sent on when groups wait to be read again.
func (c *Copy[R]) readmits() <-chan struct{} { return c.readmitWanted }

// takeReadmits returns the groups waiting to be read again, and forgets them.
func (c *Copy[R]) takeReadmits() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, 0, len(c.readmit))
	for first := range c.readmit {
		out = append(out, first)
	}
	c.readmit = nil
	return out
}

// notHeld reports whether key is one of the copy's keys over the budget,
// listed or refused, not held, and the revision of its value then.
func (c *Copy[R]) notHeld(key string) (revision uint64, ok bool) {
	first, _, _ := strings.Cut(key, ".")
	c.mu.RLock()
	defer c.mu.RUnlock()
	g := c.groups[first]
	if g == nil {
		return 0, false
	}
	if e := g.odd[key]; e != nil {
		return e.Malformed.GetRevision(), e.overBudget
	}
	revision, ok = g.refused[refusedHash(key)]
	return revision, ok
}

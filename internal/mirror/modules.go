package mirror

import (
	"slices"
	"strings"

	"google.golang.org/protobuf/proto"
)

// KeyRevisions calls each with the key and the revision of each key the
// group first holds well formed, in key order, and returns the copy's
// revision: for a reader that tells which keys changed since it last
// looked, without decoding a value. each runs under the copy's read lock,
// and must not call the copy; the key is the copy's, a window on its
// value's string: keep a clone of it, not it.
func (c *Copy[R]) KeyRevisions(first string, each func(key string, revision uint64)) (revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	if g := c.groups[first]; g != nil {
		for _, s := range g.inOrder() {
			each(s.key(), s.revision)
		}
	}
	return c.revision
}

// Odd returns the entries of the keys the group first holds otherwise than
// well formed (malformed, or not held: over the node's budget), in key
// order, each with its Malformed set.
func (c *Copy[R]) Odd(first string) []*Entry[R] {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g := c.groups[first]
	if g == nil || len(g.odd) == 0 {
		return nil
	}
	odd := make([]*Entry[R], 0, len(g.odd))
	for _, e := range g.odd {
		odd = append(odd, e)
	}
	slices.SortFunc(odd, byKey)
	return odd
}

// RangesInto returns the entries of the group first held well formed whose
// keys start with any of prefixes, in key order (prefixes given in key
// order, none starting another), decoded in scratch's arrays as GroupInto
// decodes (a view kept already is read, not decoded): for a reader of
// some modules' needs of a node, which decodes no other's, in one walk.
func (c *Copy[R]) RangesInto(first string, prefixes []string, scratch *Scratch[R]) []*Entry[R] {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g := c.groups[first]
	if g == nil {
		return nil
	}
	if v := g.view.Load(); v != nil {
		var entries []*Entry[R]
		for _, prefix := range prefixes {
			entries = appendWithPrefix(entries, v.entries, prefix)
		}
		return entries
	}
	slots := g.inOrder()
	ranges := make([][2]int, 0, len(prefixes))
	n := 0
	for _, prefix := range prefixes {
		lo, _ := slices.BinarySearchFunc(slots, prefix, func(s slot, p string) int { return strings.Compare(s.key(), p) })
		hi := lo
		for hi < len(slots) && strings.HasPrefix(slots[hi].key(), prefix) {
			hi++
		}
		ranges = append(ranges, [2]int{lo, hi})
		n += hi - lo
	}
	entries := cleared(&scratch.entries, n)
	if n == 0 {
		return entries
	}
	made, record := cleared(&scratch.made, n), c.recordsOf(n, &scratch.records)
	for _, r := range ranges {
		for _, s := range slots[r[0]:r[1]] {
			key, value := s.key(), s.value()
			// made never grows past its capacity: its elements do not move.
			made = append(made, Entry[R]{Key: key, Record: record(key, value, s.revision), size: int32(len(value)), revision: s.revision})
			entries = append(entries, &made[len(made)-1])
		}
	}
	return entries
}

// appendWithPrefix appends to out the well-formed entries of a view, in
// key order, whose keys start with prefix.
func appendWithPrefix[R proto.Message](out, entries []*Entry[R], prefix string) []*Entry[R] {
	i, _ := slices.BinarySearchFunc(entries, prefix, func(e *Entry[R], p string) int { return strings.Compare(e.Key, p) })
	for ; i < len(entries) && strings.HasPrefix(entries[i].Key, prefix); i++ {
		if entries[i].Malformed == nil {
			out = append(out, entries[i])
		}
	}
	return out
}

// valueOf returns the value the group first holds well formed at key, a
// window on the copy's string, decoding nothing and keeping no view.
func (c *Copy[R]) valueOf(first, key string) (string, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g := c.groups[first]
	if g == nil {
		return "", false
	}
	slots := g.inOrder()
	i, found := slices.BinarySearchFunc(slots, key, func(s slot, key string) int { return strings.Compare(s.key(), key) })
	if !found {
		return "", false
	}
	return slots[i].value(), true
}

package mirror

import (
	"cmp"
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

// Span is a run of a group's keys that share their second token, such as
// a node's module's needs in the needs' copy.
type Span struct {
	// Second is the keys' second token: a window on the copy's key, to be
	// cloned before it is kept.
	Second string
	// Keys counts the span's keys; Newest and Total are the greatest and
	// the sum of their revisions.
	Keys          int
	Newest, Total uint64
	// OfThirds says a key of the span has one of the thirds Spans was
	// given as its third token.
	OfThirds bool
}

// Spans calls each with every span of the keys the group first holds well
// formed, in key order, and returns the copy's revision. It reads each
// key's revision, but parses only each span's first key, and finds the
// span's end and its thirds by binary search: a walk parsing every key was
// a third of a node's new digest after one of its needs changed. thirds
// are sorted. It is for keys of four tokens or more, as the needs' are: a
// key of the first token alone is in no span, one of two tokens is a span
// alone, and a third token that is a key's last is never found. each runs
// under the copy's read lock, and must not call the copy.
func (c *Copy[R]) Spans(first string, thirds []string, each func(Span)) (revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	g := c.groups[first]
	if g == nil {
		return c.revision
	}
	slots := g.inOrder()
	for len(slots) > 0 {
		key := slots[0].key()
		if len(key) <= len(first) {
			slots = slots[1:] // the first token alone: of no span
			continue
		}
		rest := key[len(first)+1:]
		second, _, _ := strings.Cut(rest, ".")
		// The span's keys are those starting with its first key up to
		// the dot after the second token (a key of two tokens is a span
		// alone).
		prefix := key[:min(len(first)+1+len(second)+1, len(key))]
		end := 1
		if len(prefix) < len(key) {
			end += prefixEnd(slots[1:], prefix)
		}
		span := Span{Second: second, Keys: end}
		for _, s := range slots[:end] {
			span.Newest = max(span.Newest, s.revision)
			span.Total += s.revision
		}
		for _, third := range thirds {
			if span.OfThirds {
				break
			}
			span.OfThirds = spanHasThird(slots[:end], len(prefix), third)
		}
		each(span)
		slots = slots[end:]
	}
	return c.revision
}

// prefixEnd returns how many of slots, in key order and none sorting
// before prefix, start with prefix: those come first, together, by binary
// search.
func prefixEnd(slots []slot, prefix string) int {
	n, _ := slices.BinarySearchFunc(slots, prefix, func(s slot, prefix string) int {
		if strings.HasPrefix(s.key(), prefix) {
			return -1
		}
		return 1 // past them: every later key sorts after them
	})
	return n
}

// spanHasThird reports whether a key of span, past its first at bytes,
// has third as its next token and another token after it. Those keys are
// together, in key order: they start with the same bytes.
func spanHasThird(span []slot, at int, third string) bool {
	i, found := slices.BinarySearchFunc(span, third, func(s slot, third string) int {
		rest := s.key()[min(at, len(s.key())):]
		if !strings.HasPrefix(rest, third) {
			return strings.Compare(rest, third)
		}
		// Against third and a dot: the byte after third decides.
		if len(rest) == len(third) {
			return -1
		}
		return cmp.Compare(rest[len(third)], '.')
	})
	return found && i < len(span)
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
		hi := lo + prefixEnd(slots[lo:], prefix)
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

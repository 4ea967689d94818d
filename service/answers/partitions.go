package answers

import (
	"strings"

	"github.com/novox/mesh-provisioner/wire"
)

// partitions is what an instance's copy holds of a mesh split into
// partitions (serve --hold): the nodes of those Holds says yes to. A walk
// of every node's keys (a listing, a provider's provisions) reads them
// partition by partition, and its page token says where it is; each page
// is answered by an instance that holds the partition it starts in (the
// service hands it on, PartitionOf). The zero value is a copy of the whole
// mesh, walked in key order as one.
type partitions struct {
	n     int
	holds func(p int) bool // nil: the whole mesh
}

// partial reports whether the copy holds some partitions only.
func (ps partitions) partial() bool { return ps.holds != nil }

// walk reads the partitions a walk reads from partition from on, each with
// the filter of its nodes' first tokens, while this copy holds them, until
// read says the page is full. It returns the partition the next page
// starts at, if the walk stops at one this copy does not hold. A copy of
// the whole mesh is read at once, with no filter.
func (ps partitions) walk(from int, read func(p int, in func(first string) bool) (full bool)) (next int, more bool) {
	if !ps.partial() {
		read(from, nil)
		return 0, false
	}
	for p := from; p < ps.n; p++ {
		if !ps.holds(p) {
			return p, true
		}
		if read(p, ps.filter(p)) {
			return 0, false
		}
	}
	return 0, false
}

// filter returns whether a first token (a node) is of partition p; keys
// come grouped by node, so each node's partition is computed once.
func (ps partitions) filter(p int) func(first string) bool {
	last, in := "", false
	return func(first string) bool {
		if first != last {
			last, in = first, wire.PartitionOf(first, ps.n) == p
		}
		return in
	}
}

// of returns the partition of node, if the copy holds some partitions
// only: the instance that answers a request about node holds it.
func (ps partitions) of(node string) (int, bool) {
	if !ps.partial() || node == "" {
		return 0, false
	}
	return wire.PartitionOf(node, ps.n), true
}

// firstOf returns a key's first token: its node, in a state bucket.
func firstOf(key string) string {
	first, _, _ := strings.Cut(key, ".")
	return first
}

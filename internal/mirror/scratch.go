package mirror

import (
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// A Scratch is where a reader of every group in turn, such as the plans
// writer, decodes the groups it reads (Copy.GroupInto), reused from one
// group to the next: each group decoded into arrays of its own was some
// two thirds of the garbage a pass over the mesh made. What a read into a
// Scratch returns, entries and records, is valid until its next read. The
// zero Scratch is ready; a Scratch is for one goroutine at a time.
type Scratch[R proto.Message] struct {
	entries []*Entry[R]
	made    []Entry[R]
	records recordBuffers
}

// recordBuffers are the arrays a view's records are made in, for a copy's
// recordsOf that reads its values in place (needRecords, collectRecords).
type recordBuffers struct {
	needRecords    []provisionerv1.NeedRecord
	needs          []provisionerv1.Need
	collectRecords []provisionerv1.CollectRecord
	items          []provisionerv1.CollectItem
}

// cleared returns room for n elements of *arr, which are zero: the n it
// hands out are cleared of what the last read made, and may not grow into
// the rest. *arr keeps its capacity for the reads that follow, and is made
// anew when it holds fewer than n.
func cleared[T any](arr *[]T, n int) []T {
	if cap(*arr) < n {
		*arr = make([]T, 0, n)
	}
	room := (*arr)[:n:n]
	clear(room)
	return room[:0]
}

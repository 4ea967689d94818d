package answers

import (
	"encoding/binary"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Compose gives every plan item that reads a collection the same list of
// the collection's items, and a node whose modules each add to a shared
// collection holds that list in many items: most of its composition's
// bytes. The answer's binary encoding, its size and its JSON cache's keys
// are made here with each such list encoded (or sized) once an answer, as
// protobuf would encode it in each item.
//
// While a composition is encoded here its items are without their lists
// (they are put back before any function returns), so the answer must be
// the caller's alone, as every answer composeFrom builds is.

// Field numbers of the fields spliced, from the descriptors.
var (
	composePlansField = (&provisionerv1.ComposeResponse{}).ProtoReflect().Descriptor().Fields().ByName("plans").Number()
	planItemsField    = (&provisionerv1.ModulePlan{}).ProtoReflect().Descriptor().Fields().ByName("items").Number()
)

// collectedLists holds the size and the encoding of each list of collected
// items met in one answer. It encodes with marshal: deterministic, or sized
// once the answer's sizes are kept.
type collectedLists struct {
	marshal proto.MarshalOptions
	sizes   map[collectedList]int
	encoded map[collectedList][]byte
	scratch []byte // marshalCompose's, for a plan at a time
}

// collectedList identifies a list of collected items by its backing array
// and length: the answer does not change while it is encoded.
type collectedList struct {
	first **provisionerv1.CollectedItem
	len   int
}

// size returns the size of a list's encoding as a plan item's items field.
func (c *collectedLists) size(list []*provisionerv1.CollectedItem) int {
	if len(list) == 0 {
		return 0
	}
	id := collectedList{first: &list[0], len: len(list)}
	size, ok := c.sizes[id]
	if !ok {
		size = deterministic.Size(&provisionerv1.PlanItem{Items: list})
		if c.sizes == nil {
			c.sizes = map[collectedList]int{}
		}
		c.sizes[id] = size
	}
	return size
}

// encode returns a list's encoding as a plan item's items field.
func (c *collectedLists) encode(list []*provisionerv1.CollectedItem) ([]byte, error) {
	if len(list) == 0 {
		return nil, nil
	}
	id := collectedList{first: &list[0], len: len(list)}
	if encoded, ok := c.encoded[id]; ok {
		return encoded, nil
	}
	encoded, err := c.marshal.Marshal(&provisionerv1.PlanItem{Items: list})
	if err != nil {
		return nil, err
	}
	if c.encoded == nil {
		c.encoded = map[collectedList][]byte{}
	}
	c.encoded[id] = encoded
	return encoded, nil
}

// withoutLists takes the lists of collected items out of items, and
// returns them by item and a function that puts them back.
func withoutLists(items []*provisionerv1.PlanItem) (lists [][]*provisionerv1.CollectedItem, restore func()) {
	lists = make([][]*provisionerv1.CollectedItem, len(items))
	for i, item := range items {
		lists[i], item.Items = item.GetItems(), nil
	}
	return lists, func() {
		for i, item := range items {
			item.Items = lists[i]
		}
	}
}

// holdsLists reports whether any item of a plan holds collected items.
func holdsLists(plan *provisionerv1.ModulePlan) bool {
	for _, item := range plan.GetItems() {
		if len(item.GetItems()) > 0 {
			return true
		}
	}
	return false
}

// planKey appends a plan's key in the JSON cache: its encoding without its
// items' collected items, then each item's list, length-prefixed. c must
// encode deterministically, not sized.
func (c *collectedLists) planKey(key []byte, plan *provisionerv1.ModulePlan) ([]byte, error) {
	lists, restore := withoutLists(plan.GetItems())
	key, err := deterministic.MarshalAppend(key, plan)
	restore()
	if err != nil {
		return nil, err
	}
	for _, list := range lists {
		encoded, err := c.encode(list)
		if err != nil {
			return nil, err
		}
		key = binary.AppendUvarint(key, uint64(len(encoded)))
		key = append(key, encoded...)
	}
	return key, nil
}

// marshalCompose encodes a composition as proto.Marshal does but for its
// lists of collected items, each encoded once. It sizes the composition
// first, which keeps each message's size in it, so that the encoding is
// written into one buffer of its size, reusing those sizes. Its plans come
// after its other fields, which protobuf reads alike.
func marshalCompose(out *provisionerv1.ComposeResponse) ([]byte, error) {
	return newCollectedLists().marshalCompose(out)
}

// newCollectedLists returns the lists of compositions encoded by
// marshalCompose: the parts of one composition may share them.
func newCollectedLists() *collectedLists { return &collectedLists{marshal: sized} }

// marshalCompose encodes as the function marshalCompose does, each list of
// collected items sized and encoded once for every composition c encodes:
// the parts of one composition (a Composer's) share their lists.
func (c *collectedLists) marshalCompose(out *provisionerv1.ComposeResponse) ([]byte, error) {
	size := c.sizeCompose(out)
	plans := out.GetPlans()
	out.Plans = nil
	b, err := sized.MarshalAppend(make([]byte, 0, size), out)
	out.Plans = plans
	if err != nil {
		return nil, err
	}
	for _, p := range plans {
		// Each plan is encoded in the scratch buffer, then copied after
		// its length.
		if c.scratch, err = c.appendPlan(c.scratch[:0], p); err != nil {
			return nil, err
		}
		b = protowire.AppendTag(b, composePlansField, protowire.BytesType)
		b = protowire.AppendBytes(b, c.scratch)
	}
	return b, nil
}

// appendPlan appends a plan's encoding, sized by sizePlan: its items one by
// one when any holds collected items.
func (c *collectedLists) appendPlan(b []byte, plan *provisionerv1.ModulePlan) ([]byte, error) {
	if !holdsLists(plan) {
		return sized.MarshalAppend(b, plan)
	}
	items := plan.GetItems()
	plan.Items = nil
	b, err := sized.MarshalAppend(b, plan)
	plan.Items = items
	if err != nil {
		return nil, err
	}
	lists, restore := withoutLists(items)
	defer restore()
	var item []byte
	for i, it := range items {
		if item, err = sized.MarshalAppend(item[:0], it); err != nil {
			return nil, err
		}
		list, err := c.encode(lists[i])
		if err != nil {
			return nil, err
		}
		b = protowire.AppendTag(b, planItemsField, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(len(item)+len(list)))
		b = append(append(b, item...), list...)
	}
	return b, nil
}

// sizeCompose returns the size of a composition's encoding, proto.Size's,
// with each list of collected items sized once. It keeps each message's
// size in it, as proto.Size does.
func sizeCompose(out *provisionerv1.ComposeResponse) int {
	return new(collectedLists).sizeCompose(out)
}

func (c *collectedLists) sizeCompose(out *provisionerv1.ComposeResponse) int {
	plans := out.GetPlans()
	out.Plans = nil
	size := deterministic.Size(out)
	out.Plans = plans
	for _, p := range plans {
		size += protowire.SizeTag(composePlansField) + protowire.SizeBytes(c.sizePlan(p))
	}
	return size
}

// sizePlan returns the size of a plan's encoding.
func (c *collectedLists) sizePlan(plan *provisionerv1.ModulePlan) int {
	if !holdsLists(plan) {
		return deterministic.Size(plan)
	}
	items := plan.GetItems()
	plan.Items = nil
	size := deterministic.Size(plan)
	plan.Items = items
	lists, restore := withoutLists(items)
	defer restore()
	for i, it := range items {
		size += protowire.SizeTag(planItemsField) + protowire.SizeBytes(deterministic.Size(it)+c.size(lists[i]))
	}
	return size
}

package compose

import (
	"cmp"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// DigestPrefix starts every plan digest and names its definition (Digest):
// a digest of another prefix is of another definition, and differs.
const DigestPrefix = "xxh3:"

// Digest returns the digest of what a composition asks the node to apply:
// DigestPrefix and the hex XXH3-128 of its node, module, one sum for each
// module's group and the refusals of malformed needs. A module's group is
// its plans (each item but the revision at which its need was written, the
// collected items but the revisions at which they were written), its
// provisions and its refusals, field by field, each string length-prefixed
// (a collected item in its deterministic encoding), hashed apart with
// XXH3-128; the groups are in key order (a module's token and the dot after
// it). Phases, revisions, behind and the page token are left out: a need or
// item written again unchanged leaves the digest as it was, and a
// provision bound again (a new revision of the provider's key) changes it,
// since the value to read changed.
//
// A module's sum is of its group alone, so that a change of one module's
// needs can hash that module again and the sums, not the node's whole
// plan; and XXH3 hashed some thirty times faster than SHA-256 here
// (BenchmarkDigest). A digest only tells a node that its plan changed, it
// does not vouch for what the node applies (the composition it asks for):
// a collision would cost a notice, never a wrong plan.
//
// It is written field by field rather than by encoding a copy of the
// composition: a node's collection items are repeated in every item that
// reads the collection, and BenchmarkDigest measured the copy at several
// times the composition's own cost. Each collection's items are hashed
// once: Compose gives every item that reads a collection its same items.
func Digest(c *provisionerv1.ComposeResponse) string {
	var g grouper
	return g.digest(c)
}

// digest returns Digest's string of c, and how many bytes it hashed (each
// collection's items, hashed apart, not counted).
func (g *grouper) digest(c *provisionerv1.ComposeResponse) string {
	groups, malformed := g.groupsOf(c)
	return planDigest(c.GetNode(), c.GetModule(), groups, malformed, &g.hashed)
}

// A ModuleSum is the sum of one module's group of a composition, as its
// plan digest reads it (Digest): a caller that keeps a node's sums
// composes again only the modules whose needs changed (PlanDigester.Sums)
// and digests the node from its sums (DigestOfSums).
type ModuleSum struct {
	Module string
	Sum    [16]byte
}

// group is one module's group being appended: its plans, provisions and
// refusals, each list counted.
type group struct {
	plans, provisions, refusals    []byte
	nPlans, nProvisions, nRefusals int
}

// sum returns the group's sum, made in scratch, which it returns grown.
func (g *group) sum(scratch []byte, hashed *int) ([16]byte, []byte) {
	b := binary.AppendUvarint(scratch[:0], uint64(g.nPlans))
	b = append(b, g.plans...)
	b = binary.AppendUvarint(b, uint64(g.nProvisions))
	b = append(b, g.provisions...)
	b = binary.AppendUvarint(b, uint64(g.nRefusals))
	b = append(b, g.refusals...)
	*hashed += len(b)
	return xxh3.Hash128(b).Bytes(), b
}

// reset empties the group, keeping its room.
func (g *group) reset() {
	g.plans, g.provisions, g.refusals = g.plans[:0], g.provisions[:0], g.refusals[:0]
	g.nPlans, g.nProvisions, g.nRefusals = 0, 0, 0
}

// malformedRefusals are the refusals of malformed needs, in key order:
// hashed beside the modules' groups, as a malformed key's module token may
// be anything, even out of the modules' key order.
type malformedRefusals struct {
	b []byte
	n int
}

func (m *malformedRefusals) add(r *provisionerv1.Refusal) {
	m.b = appendRefusal(m.b, r)
	m.n++
}

// malformed reports whether r is the refusal of a malformed need, in the
// digest's own group.
func malformed(r *provisionerv1.Refusal) bool {
	return r.GetReason() == provisionerv1.RefusalReason_REFUSAL_REASON_MALFORMED_NEED
}

// planDigest returns the digest of node's (and module's) composition of
// groups, in key order, and malformed refusals.
func planDigest(node, module string, groups []ModuleSum, m malformedRefusals, hashed *int) string {
	b := make([]byte, 0, 64+len(groups)*32+len(m.b))
	b = appendString(b, node)
	b = appendString(b, module)
	b = binary.AppendUvarint(b, uint64(len(groups)))
	for _, g := range groups {
		b = appendString(b, g.Module)
		b = append(b, g.Sum[:]...)
	}
	b = binary.AppendUvarint(b, uint64(m.n))
	b = append(b, m.b...)
	*hashed += len(b)
	sum := xxh3.Hash128(b).Bytes()
	return DigestPrefix + hex.EncodeToString(sum[:])
}

// ModuleOrder orders modules as their needs' keys are, and a plan digest
// its modules' sums: by the module's token and the dot after it ("a-b"
// before "a", as "n.a-b." is before "n.a.").
func ModuleOrder(a, b string) int {
	n := min(len(a), len(b))
	if c := strings.Compare(a[:n], b[:n]); c != 0 {
		return c
	}
	switch {
	case len(a) == len(b):
		return 0
	case len(a) < len(b):
		return cmp.Compare('.', b[n])
	default:
		return cmp.Compare(a[n], '.')
	}
}

// A grouper reads a composition's lists into its modules' groups. The zero
// grouper is ready; one is for one goroutine at a time.
type grouper struct {
	collections collectionSums
	g           group
	scratch     []byte
	// hashed counts the bytes hashed (collections' items not counted).
	hashed int
}

// reset readies g for another composition, keeping the room its buffers
// and sums took.
func (g *grouper) reset() {
	clear(g.collections.sums)
	g.hashed = 0
}

// groupsOf returns the sums of c's modules' groups, in key order, and its
// malformed needs' refusals.
func (g *grouper) groupsOf(c *provisionerv1.ComposeResponse) ([]ModuleSum, malformedRefusals) {
	var m malformedRefusals
	plans, provisions := c.GetPlans(), c.GetProvisions()
	refusals := make([]*provisionerv1.Refusal, 0, len(c.GetRefusals()))
	for _, r := range c.GetRefusals() {
		if malformed(r) {
			m.add(r)
		} else {
			refusals = append(refusals, r)
		}
	}
	// A composition lists each in key order; one that does not (needs
	// given out of order) is read as if it did.
	plans = inModuleOrder(plans)
	provisions = inModuleOrder(provisions)
	refusals = inModuleOrder(refusals)
	var groups []ModuleSum
	for len(plans)+len(provisions)+len(refusals) > 0 {
		module := firstModule(plans, provisions, refusals)
		g.g.reset()
		for len(plans) > 0 && plans[0].GetModule() == module {
			g.g.plans = appendPlan(g.g.plans, plans[0], &g.collections)
			g.g.nPlans++
			plans = plans[1:]
		}
		for len(provisions) > 0 && provisions[0].GetModule() == module {
			g.g.provisions = appendProvision(g.g.provisions, provisions[0])
			g.g.nProvisions++
			provisions = provisions[1:]
		}
		for len(refusals) > 0 && refusals[0].GetModule() == module {
			g.g.refusals = appendRefusal(g.g.refusals, refusals[0])
			g.g.nRefusals++
			refusals = refusals[1:]
		}
		var sum [16]byte
		sum, g.scratch = g.g.sum(g.scratch, &g.hashed)
		groups = append(groups, ModuleSum{Module: module, Sum: sum})
	}
	return groups, m
}

// moduled is an element of a module's group.
type moduled interface{ GetModule() string }

// inModuleOrder returns list in the modules' key order, list itself when it
// is (a copy sorted stably when not).
func inModuleOrder[T moduled](list []T) []T {
	byModule := func(a, b T) int { return ModuleOrder(a.GetModule(), b.GetModule()) }
	if slices.IsSortedFunc(list, byModule) {
		return list
	}
	list = slices.Clone(list)
	slices.SortStableFunc(list, byModule)
	return list
}

// firstModule returns the first module in key order of the lists' heads,
// at least one of which is not empty.
func firstModule(plans []*provisionerv1.ModulePlan, provisions []*provisionerv1.Provision, refusals []*provisionerv1.Refusal) string {
	var first string
	met := false
	for _, m := range [...]moduled{headOf(plans), headOf(provisions), headOf(refusals)} {
		if m == nil {
			continue
		}
		if module := m.GetModule(); !met || ModuleOrder(module, first) < 0 {
			first, met = module, true
		}
	}
	return first
}

// headOf returns list's first element, or nil.
func headOf[T moduled](list []T) moduled {
	if len(list) == 0 {
		return nil
	}
	return list[0]
}

// appendPlan appends a plan: its head, then its items.
func appendPlan(b []byte, p *provisionerv1.ModulePlan, collections *collectionSums) []byte {
	b = appendPlanHead(b, p)
	for _, item := range p.GetItems() {
		b = appendItem(b, item, collections)
	}
	return b
}

// A DigestPart is what Digest reads of a part of a composition (a
// [Composer]'s part): its modules' sums and its malformed needs' refusals.
// A composition whose parts are kept, and composed again only where their
// needs changed, is digested from its parts' DigestParts (DigestOf)
// without reading the parts kept again. A PartDigester reads them.
type DigestPart struct {
	groups    []ModuleSum
	malformed malformedRefusals
}

// A PartDigester reads the parts of one composition for DigestOf, each
// collection's items hashed once for all of them: a node's modules that
// add to a shared collection each read its items. It keeps each
// collection's sum by its name, which the parts' Arena may have made: use
// one for the parts of one composition only, not past its Arena's Reset.
// The zero PartDigester is ready; one is for one goroutine at a time.
type PartDigester struct {
	g grouper
}

// Part reads a part of the composition.
func (d *PartDigester) Part(c *provisionerv1.ComposeResponse) DigestPart {
	groups, m := d.g.groupsOf(c)
	m.b = slices.Clip(m.b)
	return DigestPart{groups: slices.Clip(groups), malformed: m}
}

// Size returns the bytes a part holds.
func (p DigestPart) Size() int { return len(p.groups)*(16+16) + len(p.malformed.b) }

// DigestOf returns the Digest of the composition of node (and module) made
// of parts, in key order: the composition whose plans, provisions and
// refusals are the parts' one after the other. No module may have needs
// in two parts.
func DigestOf(node, module string, parts ...DigestPart) string {
	var groups []ModuleSum
	var m malformedRefusals
	for _, p := range parts {
		groups = append(groups, p.groups...)
		m.b = append(m.b, p.malformed.b...)
		m.n += p.malformed.n
	}
	var hashed int
	return planDigest(node, module, groups, m, &hashed)
}

// appendPlanHead appends a plan's fields but its items, and their count.
func appendPlanHead(b []byte, p *provisionerv1.ModulePlan) []byte {
	return appendPlanFields(b, p.GetModule(), p.GetWantedBuild(), p.GetNewestBuild(), len(p.GetItems()))
}

func appendPlanFields(b []byte, module, wanted, newest string, items int) []byte {
	b = appendString(b, module)
	b = appendString(b, wanted)
	b = appendString(b, newest)
	return binary.AppendUvarint(b, uint64(items))
}

func appendProvision(b []byte, p *provisionerv1.Provision) []byte {
	for _, s := range []string{p.GetProvider(), p.GetBucket(), p.GetKey(), p.GetModule(), p.GetProvision(), p.GetLocal(), p.GetName(), p.GetNode(), p.GetManifestDigest()} {
		b = appendString(b, s)
	}
	b = appendStrings(b, p.GetBuilds())
	return binary.AppendUvarint(b, p.GetBoundRevision())
}

func appendRefusal(b []byte, r *provisionerv1.Refusal) []byte {
	for _, s := range []string{r.GetKey(), r.GetModule(), r.GetKind(), r.GetName(), r.GetDetail()} {
		b = appendString(b, s)
	}
	b = binary.AppendUvarint(b, uint64(r.GetReason()))
	return appendStrings(b, r.GetBuilds())
}

func appendString[S string | []byte](b []byte, s S) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendStrings(b []byte, list []string) []byte {
	b = binary.AppendUvarint(b, uint64(len(list)))
	for _, s := range list {
		b = appendString(b, s)
	}
	return b
}

// deterministic encodes collected items; sized encodes one just sized.
var (
	deterministic = proto.MarshalOptions{Deterministic: true}
	sized         = proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
)

// appendMessage appends a message's deterministic encoding, length-
// prefixed. A message of this package's making always encodes; one that
// would not is written as empty, as its answer would not encode either.
func appendMessage(b []byte, m proto.Message) []byte {
	b = binary.AppendUvarint(b, uint64(deterministic.Size(m)))
	out, err := sized.MarshalAppend(b, m)
	if err != nil {
		return b
	}
	return out
}

// appendItem appends a plan item but the revision at which its need was
// written, and its collection's items hashed, once per collection.
func appendItem(b []byte, item *provisionerv1.PlanItem, collections *collectionSums) []byte {
	b = appendItemHead(b, item.GetKind(), item.GetName(), item.GetPlaceholder(), item.GetOwner())
	switch loc := item.GetLocation().(type) {
	case *provisionerv1.PlanItem_Bucket:
		b = appendBucketLocation(b, loc.Bucket.GetBucket(), loc.Bucket.GetKey())
	case *provisionerv1.PlanItem_Verb:
		b = appendVerbLocation(b, loc.Verb)
	default:
		b = appendString(b, "")
	}
	b = appendStrings(b, item.GetBuilds())
	if item.GetCollection() == "" {
		return appendNoCollection(b)
	}
	return appendCollection(b, item.GetCollection(), collections.of(item.GetCollection(), item.GetItems()))
}

// The parts of a plan item's digest, in order: its head, its location, its
// builds (appendStrings), its collection. PlanDigester.Digest appends them
// from a need resolved, as appendItem does from the item made of it.

func appendItemHead(b []byte, kind, name, placeholder, owner string) []byte {
	b = appendString(b, kind)
	b = appendString(b, name)
	b = appendString(b, placeholder)
	return appendString(b, owner)
}

func appendBucketLocation[K string | []byte](b []byte, bucket string, key K) []byte {
	b = appendString(b, "bucket")
	b = appendString(b, bucket)
	return appendString(b, key)
}

func appendVerbLocation(b []byte, verb *provisionerv1.VerbSource) []byte {
	b = appendString(b, "verb")
	b = appendString(b, verb.GetSeat())
	return appendString(b, verb.GetSubject())
}

func appendNoCollection(b []byte) []byte {
	b = appendString(b, "")
	return binary.AppendUvarint(b, 0)
}

func appendCollection(b []byte, collection string, sum [16]byte) []byte {
	b = appendString(b, collection)
	b = binary.AppendUvarint(b, 1)
	return append(b, sum[:]...)
}

// collectionSums hashes each collection's items once, in one buffer
// reused from a collection to the next: a buffer grown for each was over
// a third of BenchmarkDigest's allocations.
type collectionSums struct {
	sums    map[string][16]byte
	scratch []byte
}

// collected is a collection's item, as a plan item lists it or as the
// node's record of it holds it.
type collected interface {
	GetContributor() string
	GetItem() *provisionerv1.CollectItem
}

// of returns the hash of a collection's items.
func (c *collectionSums) of(collection string, items []*provisionerv1.CollectedItem) [16]byte {
	return collectionSum(c, collection, items)
}

// collectionSum is collectionSums.of for items of either form.
func collectionSum[T collected](c *collectionSums, collection string, items []T) [16]byte {
	if sum, ok := c.sums[collection]; ok {
		return sum
	}
	b := binary.AppendUvarint(c.scratch[:0], uint64(len(items)))
	for _, it := range items {
		b = appendString(b, it.GetContributor())
		b = appendCollectItem(b, it.GetItem())
	}
	c.scratch = b
	sum := xxh3.Hash128(b).Bytes()
	if c.sums == nil {
		c.sums = map[string][16]byte{}
	}
	c.sums[collection] = sum
	return sum
}

// appendCollectItem appends item as appendMessage does: its deterministic
// encoding, length-prefixed. It is written with protowire rather than by
// protobuf-go's marshalling, which sorts the attributes' keys through
// reflection and was four fifths of hashing a node's collections (a tenth
// of composing a 60 x 25 node, BenchmarkComposeNode). An item holding
// fields unknown to this build, or strings that are not UTF-8 (which do
// not marshal), is left to appendMessage. TestAppendCollectItem holds the
// two to the same bytes.
func appendCollectItem(b []byte, item *provisionerv1.CollectItem) []byte {
	if item == nil || len(item.ProtoReflect().GetUnknown()) > 0 || !utf8.ValidString(item.GetValue()) {
		return appendMessage(b, item)
	}
	attributes := item.GetAttributes()
	var inline [4]string
	names := inline[:0]
	size := 0
	if v := item.GetValue(); v != "" {
		size += protowire.SizeTag(collectItemValue) + protowire.SizeBytes(len(v))
	}
	if o := item.GetOrder(); o != 0 {
		size += protowire.SizeTag(collectItemOrder) + protowire.SizeVarint(uint64(int64(o)))
	}
	for name, value := range attributes {
		if !utf8.ValidString(name) || !utf8.ValidString(value) {
			return appendMessage(b, item)
		}
		names = append(names, name)
		size += protowire.SizeTag(collectItemAttributes) + protowire.SizeBytes(attributeSize(name, value))
	}
	b = protowire.AppendVarint(b, uint64(size))
	if v := item.GetValue(); v != "" {
		b = protowire.AppendTag(b, collectItemValue, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	if o := item.GetOrder(); o != 0 {
		b = protowire.AppendTag(b, collectItemOrder, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(int64(o)))
	}
	slices.Sort(names)
	for _, name := range names {
		value := attributes[name]
		b = protowire.AppendTag(b, collectItemAttributes, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(attributeSize(name, value)))
		// A map entry's key and value are written even when empty.
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, name)
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, value)
	}
	return b
}

// CollectItem's fields, in the order a deterministic encoding writes them.
const (
	collectItemValue      protowire.Number = 1
	collectItemOrder      protowire.Number = 2
	collectItemAttributes protowire.Number = 3
)

// attributeSize is the size of an attribute's map entry.
func attributeSize(name, value string) int {
	return 2*protowire.SizeTag(1) + protowire.SizeBytes(len(name)) + protowire.SizeBytes(len(value))
}

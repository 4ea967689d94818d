package compose

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Digest returns the digest of what a composition asks the node to apply:
// "sha256:" and the hex SHA-256 of its node, module, plans (each item but
// the revision at which its need was written, the collected items but the
// revisions at which they were written), provisions and refusals, field by
// field, each string length-prefixed (a collected item in its
// deterministic encoding). Phases, revisions, behind and the page token are
// left out: a need or item written again unchanged leaves the digest as it
// was, and a provision bound again (a new revision of the provider's key)
// changes it, since the value to read changed.
//
// It is written field by field rather than by encoding a copy of the
// composition: a node's collection items are repeated in every item that
// reads the collection, and BenchmarkDigest measured the copy at several
// times the composition's own cost. Each collection's items are hashed
// once: Compose gives every item that reads a collection its same items.
func Digest(c *provisionerv1.ComposeResponse) string {
	sum, _ := digest(c)
	return "sha256:" + hex.EncodeToString(sum)
}

// digest returns Digest's hash of c, and how many bytes it hashed (each
// collection's items, hashed apart, not counted).
func digest(c *provisionerv1.ComposeResponse) (sum []byte, hashed int) {
	// The fields are appended to a local buffer, written to the hash in
	// blocks: a write a field, or a buffer in a struct (each append a
	// write barrier while the collector runs), cost more than the hashing.
	h := sha256.New()
	b := make([]byte, 0, 2*digestBlock)
	flush := func() {
		if len(b) > digestBlock {
			h.Write(b)
			hashed += len(b)
			b = b[:0]
		}
	}
	var collections collectionSums
	b = appendString(b, c.GetNode())
	b = appendString(b, c.GetModule())
	b = binary.AppendUvarint(b, uint64(len(c.GetPlans())))
	for _, p := range c.GetPlans() {
		b = appendPlanHead(b, p)
		for _, item := range p.GetItems() {
			b = appendItem(b, item, &collections)
			flush()
		}
	}
	b = binary.AppendUvarint(b, uint64(len(c.GetProvisions())))
	for _, p := range c.GetProvisions() {
		b = appendProvision(b, p)
		flush()
	}
	b = binary.AppendUvarint(b, uint64(len(c.GetRefusals())))
	for _, r := range c.GetRefusals() {
		b = appendRefusal(b, r)
		flush()
	}
	h.Write(b)
	return h.Sum(nil), hashed + len(b)
}

// A DigestPart is what Digest reads of a part of a composition (a
// [Composer]'s part): its plans, provisions and refusals, read once. A
// composition whose parts are kept, and composed again only where their
// needs changed, is digested from its parts' DigestParts (DigestOf)
// without reading the parts kept again. A PartDigester reads them.
type DigestPart struct {
	plans, provisions, refusals    []byte
	nPlans, nProvisions, nRefusals int
}

// A PartDigester reads the parts of one composition for DigestOf, each
// collection's items hashed once for all of them: a node's modules that
// add to a shared collection each read its items. The zero PartDigester is
// ready; one is for one goroutine at a time.
type PartDigester struct {
	collections collectionSums
	// scratch is where a list's fields are appended, then copied out at
	// their size: a part kept holds no room to grow.
	scratch []byte
}

// Part reads a part of the composition.
func (d *PartDigester) Part(c *provisionerv1.ComposeResponse) DigestPart {
	b := d.scratch[:0]
	for _, plan := range c.GetPlans() {
		b = appendPlanHead(b, plan)
		for _, item := range plan.GetItems() {
			b = appendItem(b, item, &d.collections)
		}
	}
	plans := len(b)
	for _, provision := range c.GetProvisions() {
		b = appendProvision(b, provision)
	}
	provisions := len(b)
	for _, r := range c.GetRefusals() {
		b = appendRefusal(b, r)
	}
	d.scratch = b
	// One array for the three lists, each a full slice expression: none
	// may grow into the next.
	kept := slices.Clone(b)
	return DigestPart{
		plans: kept[:plans:plans], provisions: kept[plans:provisions:provisions], refusals: kept[provisions:],
		nPlans: len(c.GetPlans()), nProvisions: len(c.GetProvisions()), nRefusals: len(c.GetRefusals()),
	}
}

// Size returns the bytes a part holds.
func (p DigestPart) Size() int { return len(p.plans) + len(p.provisions) + len(p.refusals) }

// DigestOf returns the Digest of the composition of node (and module) made
// of parts, in order: the composition whose plans, provisions and refusals
// are the parts' one after the other. No module's plan may continue from
// one part to the next, as Digest reads it as one plan.
func DigestOf(node, module string, parts ...DigestPart) string {
	h := sha256.New()
	var nPlans, nProvisions, nRefusals int
	for _, p := range parts {
		nPlans, nProvisions, nRefusals = nPlans+p.nPlans, nProvisions+p.nProvisions, nRefusals+p.nRefusals
	}
	b := appendString(nil, node)
	b = appendString(b, module)
	h.Write(binary.AppendUvarint(b, uint64(nPlans)))
	for _, p := range parts {
		h.Write(p.plans)
	}
	h.Write(binary.AppendUvarint(b[:0], uint64(nProvisions)))
	for _, p := range parts {
		h.Write(p.provisions)
	}
	h.Write(binary.AppendUvarint(b[:0], uint64(nRefusals)))
	for _, p := range parts {
		h.Write(p.refusals)
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
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

// digestBlock is how many bytes Digest gathers before it hashes them.
const digestBlock = 32 << 10

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

func appendCollection(b []byte, collection string, sum [sha256.Size]byte) []byte {
	b = appendString(b, collection)
	b = binary.AppendUvarint(b, 1)
	return append(b, sum[:]...)
}

// collectionSums hashes each collection's items once, in one buffer
// reused from a collection to the next: a buffer grown for each was over
// a third of BenchmarkDigest's allocations.
type collectionSums struct {
	sums    map[string][sha256.Size]byte
	scratch []byte
}

// collected is a collection's item, as a plan item lists it or as the
// node's record of it holds it.
type collected interface {
	GetContributor() string
	GetItem() *provisionerv1.CollectItem
}

// of returns the hash of a collection's items.
func (c *collectionSums) of(collection string, items []*provisionerv1.CollectedItem) [sha256.Size]byte {
	return collectionSum(c, collection, items)
}

// collectionSum is collectionSums.of for items of either form.
func collectionSum[T collected](c *collectionSums, collection string, items []T) [sha256.Size]byte {
	if sum, ok := c.sums[collection]; ok {
		return sum
	}
	b := binary.AppendUvarint(c.scratch[:0], uint64(len(items)))
	for _, it := range items {
		b = appendString(b, it.GetContributor())
		b = appendMessage(b, it.GetItem())
	}
	c.scratch = b
	sum := sha256.Sum256(b)
	if c.sums == nil {
		c.sums = map[string][sha256.Size]byte{}
	}
	c.sums[collection] = sum
	return sum
}

package compose

import (
	"strings"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// A PlanDigester digests compositions without making them: for a caller
// that keeps nothing of a node's composition but its digest, as the
// service's plans writer, which digests every node of the mesh once it
// takes the seat. Each need is resolved as Compose resolves it and appended
// to its module's group as Digest appends the plan item made of it, in
// buffers the PlanDigester reuses from one composition to the next: no
// message is made for a plan item (nor its location, nor its key's
// string), only for a provision or a refusal.
//
// The zero PlanDigester is ready; one is for one goroutine at a time.
type PlanDigester struct {
	// g is the group of the module being appended (open), item the items
	// of its plan being appended (a plan's digest counts its items first),
	// and groups the sums of the groups appended.
	g         group
	open      bool
	module    string
	planItems []byte
	groups    []ModuleSum
	scratch   []byte
	// outOfOrder is set when a module's group was met after another's it
	// does not follow in key order, or a refusal after one of a later key
	// (needs given out of order, which a composition's refusals are not):
	// Digest then digests the composition made.
	outOfOrder  bool
	lastRefusal string
	collections collectionSums
	// provisionScratch holds each provision while it is appended, text
	// the strings of one composition's keys and collections, and
	// resolved the registry entries made ready, kept from one to the next.
	provisionScratch provisionerv1.Provision
	text             texts
	resolved         resolvedCache
	// cache and loadItems are SumsOf's: the caller's sums of the node's
	// collections, and what reads the node's items when one is missing.
	cache     *CollectionCache
	loadItems func() []*provisionerv1.CollectRecord
	// byCollection lists the node's items of each collection, grouped
	// once the first need that reads a collection is met.
	byCollection map[string][]*provisionerv1.CollectRecord
	grouped      bool
	// What Digest is walking: its input, the plan being appended (its
	// module, builds and items so far).
	in                     *Input
	planOf, wanted, newest string
	items                  int
	hashed                 int // not read: Digest's count, for group.sum
}

// Digest returns Digest(Compose(in)). in.Arena is not read.
func (d *PlanDigester) Digest(in Input) string {
	sums, ok := d.Sums(in)
	if !ok {
		return Digest(Compose(in))
	}
	return DigestOfSums(in.Node, in.Module, sums, in.Malformed)
}

// Sums returns the sums of the groups in's needs make, module by module in
// key order, as Digest(Compose(in)) reads them; the needs may be some
// modules' of the node alone. ok is false when the needs are not in key
// order: the node is then to be digested whole. in.Malformed is not read
// (DigestOfSums reads the node's). The sums are valid until the next call.
func (d *PlanDigester) Sums(in Input) (sums []ModuleSum, ok bool) {
	return d.SumsOf(in, nil, nil)
}

// SumsOf is Sums for a caller that keeps the sums of the node's
// collections from one call to the next in cache, for as long as the
// node's items do not change, and whose items (in.Items unset) are read
// by items only when a collection's sum is missing from the cache.
func (d *PlanDigester) SumsOf(in Input, cache *CollectionCache, items func() []*provisionerv1.CollectRecord) (sums []ModuleSum, ok bool) {
	d.reset()
	d.in, d.cache, d.loadItems = &in, cache, items
	rs := newResolver(in.Sources)
	rs.text, rs.made = &d.text, &d.resolved
	rs.walk(&in, in.Needs, d)
	d.closeGroup()
	d.in, d.cache, d.loadItems = nil, nil, nil
	return d.groups, !d.outOfOrder
}

// A CollectionCache keeps the sums of one node's collections between
// PlanDigester.SumsOf's calls, while the node's items do not change. The
// zero CollectionCache is empty.
type CollectionCache struct {
	sums map[string][16]byte
}

// DigestOfSums returns the Digest of the composition of node (and module)
// whose modules' groups have sums, in key order, and whose malformed needs
// are malformed.
func DigestOfSums(node, module string, sums []ModuleSum, malformed []*provisionerv1.MalformedKey) string {
	var m malformedRefusals
	for _, r := range refuseMalformed(nil, malformed, module) {
		m.add(r)
	}
	var hashed int
	return planDigest(node, module, sums, m, &hashed)
}

// groupOf makes module's group the one appended to, closing the one open.
func (d *PlanDigester) groupOf(module string) {
	if d.open && d.module == module {
		return
	}
	d.closeGroup()
	if n := len(d.groups); n > 0 && ModuleOrder(d.groups[n-1].Module, module) >= 0 {
		d.outOfOrder = true
	}
	d.open, d.module = true, module
}

// closeGroup sums the group open, if any, its plan being appended ended.
func (d *PlanDigester) closeGroup() {
	d.endPlan()
	if !d.open {
		return
	}
	var sum [16]byte
	sum, d.scratch = d.g.sum(d.scratch, &d.hashed)
	d.groups = append(d.groups, ModuleSum{Module: d.module, Sum: sum})
	d.g.reset()
	d.open = false
}

// plan ends the plan being appended, if any, and starts module's.
func (d *PlanDigester) plan(module string, b *builds) {
	d.endPlan()
	d.groupOf(module)
	d.planOf, d.wanted, d.newest = module, b.wanted, b.newest
	d.g.nPlans++
}

// endPlan appends the plan being appended to its group, its items counted
// first.
func (d *PlanDigester) endPlan() {
	if d.items == 0 {
		return
	}
	d.g.plans = appendPlanFields(d.g.plans, d.planOf, d.wanted, d.newest, d.items)
	d.g.plans = append(d.g.plans, d.planItems...)
	d.planItems, d.items = d.planItems[:0], 0
}

func (d *PlanDigester) item(need *provisionerv1.NeedRecord, res resolution, builds []string) string {
	if !d.open || d.module != need.GetModule() {
		// The walk's plan goes on past another module's refusal: needs
		// out of order.
		d.outOfOrder = true
	}
	d.planItems = d.appendResolved(d.planItems, d.in, need, &res, builds)
	d.items++
	return "" // appended as bytes
}

func (d *PlanDigester) provision(need *provisionerv1.NeedRecord, res resolution, builds []string) {
	p := res.fillProvision(&d.provisionScratch, need, builds)
	d.groupOf(p.GetModule())
	d.g.provisions = appendProvision(d.g.provisions, p)
	d.g.nProvisions++
}

// refusal appends a refusal the walk made, of a need well formed: in its
// module's group.
func (d *PlanDigester) refusal(r *provisionerv1.Refusal) {
	d.groupOf(r.GetModule())
	if d.g.nRefusals > 0 && r.GetKey() < d.lastRefusal {
		d.outOfOrder = true
	}
	d.lastRefusal = r.GetKey()
	d.g.refusals = appendRefusal(d.g.refusals, r)
	d.g.nRefusals++
}

// appendResolved appends the plan item need resolved to, as appendItem
// appends the item Part makes of it.
func (d *PlanDigester) appendResolved(b []byte, in *Input, need *provisionerv1.NeedRecord, res *resolution, builds []string) []byte {
	b = appendItemHead(b, need.GetKind(), need.GetName(), need.GetNeed().GetPlaceholder(), res.owner)
	if res.verb != nil {
		b = appendVerbLocation(b, res.verb)
	} else {
		b = appendBucketLocation(b, res.bucket, res.key)
	}
	b = appendStrings(b, builds)
	if res.collection == "" {
		return appendNoCollection(b)
	}
	if sum, ok := d.cache.sum(res.collection); ok {
		return appendCollection(b, res.collection, sum)
	}
	if !d.grouped {
		if d.byCollection == nil {
			d.byCollection = map[string][]*provisionerv1.CollectRecord{}
		}
		d.grouped = true
		items := in.Items
		if items == nil && d.loadItems != nil {
			items = d.loadItems()
		}
		for _, it := range items {
			d.byCollection[it.GetCollection()] = append(d.byCollection[it.GetCollection()], it)
		}
	}
	sum := collectionSum(&d.collections, res.collection, d.byCollection[res.collection])
	d.cache.put(res.collection, sum)
	return appendCollection(b, res.collection, sum)
}

// reset readies the buffers for a composition, keeping their room.
func (d *PlanDigester) reset() {
	d.g.reset()
	d.open, d.module, d.outOfOrder = false, "", false
	d.planItems, d.items = d.planItems[:0], 0
	clear(d.groups)
	d.groups = d.groups[:0]
	clear(d.collections.sums)
	clear(d.byCollection)
	d.grouped = false
	d.text.reset()
	d.planOf, d.wanted, d.newest = "", "", ""
}

func (c *CollectionCache) sum(collection string) ([16]byte, bool) {
	if c == nil {
		return [16]byte{}, false
	}
	sum, ok := c.sums[collection]
	return sum, ok
}

func (c *CollectionCache) put(collection string, sum [16]byte) {
	if c == nil {
		return
	}
	if c.sums == nil {
		c.sums = map[string][16]byte{}
	}
	// Kept past the composition, whose text made collection.
	c.sums[strings.Clone(collection)] = sum
}

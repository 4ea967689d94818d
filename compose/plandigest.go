package compose

import (
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
	groups    []moduleSum
	scratch   []byte
	// outOfOrder is set when a module's group was met after another's it
	// does not follow in key order, or a refusal after one of a later key
	// (needs given out of order, which a composition's refusals are not):
	// Digest then digests the composition made.
	outOfOrder  bool
	lastRefusal string
	collections collectionSums
	// byCollection lists the node's items of each collection, grouped
	// once the first need that reads a collection is met.
	byCollection map[string][]*provisionerv1.CollectRecord
	grouped      bool
	// What Digest is walking: its input, the plan being appended (its
	// module, builds and items so far).
	in                     *Input
	planOf, wanted, newest string
	items                  int
	hashed                 int
}

// Digest returns Digest(Compose(in)). in.Arena is not read.
func (d *PlanDigester) Digest(in Input) string {
	d.reset()
	d.in = &in
	newResolver(in.Sources).walk(&in, in.Needs, d)
	d.closeGroup()
	d.in = nil
	if d.outOfOrder {
		return Digest(Compose(in))
	}
	var m malformedRefusals
	for _, r := range refuseMalformed(nil, in.Malformed, in.Module) {
		m.add(r)
	}
	return planDigest(in.Node, in.Module, d.groups, m, &d.hashed)
}

// groupOf makes module's group the one appended to, closing the one open.
func (d *PlanDigester) groupOf(module string) {
	if d.open && d.module == module {
		return
	}
	d.closeGroup()
	if n := len(d.groups); n > 0 && moduleOrder(d.groups[n-1].module, module) >= 0 {
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
	d.groups = append(d.groups, moduleSum{module: d.module, sum: sum})
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

func (d *PlanDigester) provision(p *provisionerv1.Provision) {
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
	if !d.grouped {
		if d.byCollection == nil {
			d.byCollection = map[string][]*provisionerv1.CollectRecord{}
		}
		d.grouped = true
		for _, it := range in.Items {
			d.byCollection[it.GetCollection()] = append(d.byCollection[it.GetCollection()], it)
		}
	}
	return appendCollection(b, res.collection, collectionSum(&d.collections, res.collection, d.byCollection[res.collection]))
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
	d.planOf, d.wanted, d.newest = "", "", ""
}

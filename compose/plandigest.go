package compose

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// A PlanDigester digests compositions without making them: for a caller
// that keeps nothing of a node's composition but its digest, as the
// service's plans writer, which digests every node of the mesh once it
// takes the seat. Each need is resolved as Compose resolves it and appended
// to the digest as Digest appends the plan item made of it, in buffers the
// PlanDigester reuses from one composition to the next: no message is made
// for a plan item (nor its location, nor its key's string), only for a
// provision or a refusal.
//
// The zero PlanDigester is ready; one is for one goroutine at a time.
type PlanDigester struct {
	// plans holds the plans appended, module holds the items of the plan
	// being appended (a plan's digest counts its items first), provisions
	// the provisions'.
	plans, module, provisions []byte
	refusals                  []*provisionerv1.Refusal
	collections               collectionSums
	// byCollection lists the node's items of each collection, grouped
	// once the first need that reads a collection is met.
	byCollection map[string][]*provisionerv1.CollectRecord
	grouped      bool
}

// Digest returns Digest(Compose(in)). in.Arena is not read.
func (d *PlanDigester) Digest(in Input) string {
	d.reset()
	rs := newResolver(in.Sources)
	var (
		plans, items, provisions int
		// The plan being appended: its module and builds. A module's
		// needs are contiguous in key order; a module met again after
		// another (needs out of order) starts a plan again, as in Part.
		planOf         string
		wanted, newest string
	)
	endPlan := func() {
		if items == 0 {
			return
		}
		d.plans = appendPlanFields(d.plans, planOf, wanted, newest, items)
		d.plans = append(d.plans, d.module...)
		d.module, items = d.module[:0], 0
	}
	for _, need := range in.Needs {
		if in.Module != "" && need.GetModule() != in.Module {
			continue
		}
		moduleBuilds := rs.buildsOf(in.Node, need.GetModule())
		builds, inPlan := moduleBuilds.of(need.GetNeed())
		if !inPlan {
			continue
		}
		res, refusal := rs.resolveNeed(in.Node, need, rs.resolve(need.GetKind()), builds)
		if refusal != nil {
			d.refusals = append(d.refusals, refusal)
			continue
		}
		if items == 0 || planOf != need.GetModule() {
			endPlan()
			planOf, wanted, newest = need.GetModule(), moduleBuilds.wanted, moduleBuilds.newest
			plans++
		}
		d.module = d.appendResolved(d.module, &in, need, &res, builds)
		items++
		if res.provided {
			d.provisions = appendProvision(d.provisions, res.provisionOf(need, builds))
			provisions++
		}
	}
	endPlan()
	d.refusals = refuseMalformed(d.refusals, in.Malformed, in.Module)

	// The plans are whole: the module's buffer is free for the head and
	// the refusals.
	h := sha256.New()
	b := appendString(d.module[:0], in.Node)
	b = appendString(b, in.Module)
	h.Write(binary.AppendUvarint(b, uint64(plans)))
	h.Write(d.plans)
	h.Write(binary.AppendUvarint(b[:0], uint64(provisions)))
	h.Write(d.provisions)
	b = binary.AppendUvarint(b[:0], uint64(len(d.refusals)))
	for _, r := range d.refusals {
		b = appendRefusal(b, r)
	}
	h.Write(b)
	d.module = b[:0]
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
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
	d.plans, d.module, d.provisions = d.plans[:0], d.module[:0], d.provisions[:0]
	clear(d.refusals)
	d.refusals = d.refusals[:0]
	clear(d.collections.sums)
	clear(d.byCollection)
	d.grouped = false
}

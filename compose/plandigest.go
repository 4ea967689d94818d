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
	// What Digest is walking: its input, the plan being appended (its
	// module, builds and items so far), and the plans and provisions
	// appended.
	in                          *Input
	planOf, wanted, newest      string
	items                       int
	plansCount, provisionsCount int
}

// Digest returns Digest(Compose(in)). in.Arena is not read.
func (d *PlanDigester) Digest(in Input) string {
	d.reset()
	d.in = &in
	newResolver(in.Sources).walk(&in, in.Needs, d)
	d.endPlan()
	d.refusals = refuseMalformed(d.refusals, in.Malformed, in.Module)

	// The plans are whole: the module's buffer is free for the head and
	// the refusals.
	h := sha256.New()
	b := appendString(d.module[:0], in.Node)
	b = appendString(b, in.Module)
	h.Write(binary.AppendUvarint(b, uint64(d.plansCount)))
	h.Write(d.plans)
	h.Write(binary.AppendUvarint(b[:0], uint64(d.provisionsCount)))
	h.Write(d.provisions)
	b = binary.AppendUvarint(b[:0], uint64(len(d.refusals)))
	for _, r := range d.refusals {
		b = appendRefusal(b, r)
	}
	h.Write(b)
	d.module = b[:0]
	d.in = nil
	return "sha256:" + hex.EncodeToString(h.Sum(nil))
}

// plan ends the plan being appended, if any, and starts module's.
func (d *PlanDigester) plan(module string, b *builds) {
	d.endPlan()
	d.planOf, d.wanted, d.newest = module, b.wanted, b.newest
	d.plansCount++
}

// endPlan appends the plan being appended, its items counted first.
func (d *PlanDigester) endPlan() {
	if d.items == 0 {
		return
	}
	d.plans = appendPlanFields(d.plans, d.planOf, d.wanted, d.newest, d.items)
	d.plans = append(d.plans, d.module...)
	d.module, d.items = d.module[:0], 0
}

func (d *PlanDigester) item(need *provisionerv1.NeedRecord, res resolution, builds []string) string {
	d.module = d.appendResolved(d.module, d.in, need, &res, builds)
	d.items++
	return "" // appended as bytes
}

func (d *PlanDigester) provision(p *provisionerv1.Provision) {
	d.provisions = appendProvision(d.provisions, p)
	d.provisionsCount++
}

func (d *PlanDigester) refusal(r *provisionerv1.Refusal) { d.refusals = append(d.refusals, r) }

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
	d.planOf, d.wanted, d.newest, d.items = "", "", "", 0
	d.plansCount, d.provisionsCount = 0, 0
}

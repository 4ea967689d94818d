package compose

import provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"

// A sink hears a composition as walk makes it, need by need in key order:
// each module's plan as it starts, each need's plan item (resolved, not
// yet a message), each provision it asks of a provider, and each refusal.
// Part makes messages of them; PlanDigester appends them to a digest.
type sink interface {
	plan(module string, b *builds)
	// item returns the key's string if it made one, for the provision
	// that follows to reuse rather than make again.
	item(need *provisionerv1.NeedRecord, res resolution, builds []string) (key string)
	provision(need *provisionerv1.NeedRecord, res resolution, builds []string)
	refusal(r *provisionerv1.Refusal)
}

// walk is the one composition: it resolves needs, in key order, of in's
// node (and in.Module's alone, if set), and tells s what each resolves to.
// A need of a build the node neither wants nor knows as newest is in no
// plan. A module's needs are contiguous in key order; a module met again
// after another (needs out of order) starts a plan again. The refusals of
// malformed keys are the caller's to add (refuseMalformed), as they order
// every refusal.
func (rs *resolver) walk(in *Input, needs []*provisionerv1.NeedRecord, s sink) {
	planOf, planned := "", false
	for _, need := range needs {
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
			s.refusal(refusal)
			continue
		}
		if !planned || planOf != need.GetModule() {
			planOf, planned = need.GetModule(), true
			s.plan(planOf, moduleBuilds)
		}
		if key := s.item(need, res, builds); key != "" {
			res.keyString = key
		}
		if res.provided {
			s.provision(need, res, builds)
		}
	}
}

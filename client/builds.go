package client

import (
	"slices"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// PlanAt returns the items of a module's plan at build: those whose builds
// name it. A plan that names no build (its module's applied record names
// none) holds every item at every build. A build that is neither the
// plan's wanted nor its newest has no items.
func PlanAt(plan *provisionerv1.ModulePlan, build string) []*provisionerv1.PlanItem {
	if plan.GetWantedBuild() == "" && plan.GetNewestBuild() == "" {
		return plan.GetItems()
	}
	var items []*provisionerv1.PlanItem
	for _, item := range plan.GetItems() {
		if slices.Contains(item.GetBuilds(), build) {
			items = append(items, item)
		}
	}
	return items
}

// IsBound reports whether a provider has bound a provision: its
// bound_revision, the revision of its key in the provider's bucket
// (<provider>_bound), is set. Zero is pending: the key, or the bucket, does
// not exist yet (docs/protocol.md, "Providers' entries and manifests").
func IsBound(p *provisionerv1.Provision) bool {
	return p.GetBoundRevision() > 0
}

// Pending returns the provisions of a composition that their providers
// have not bound yet (IsBound false), in the composition's order: the
// composition's own, not copies.
func Pending(composition *provisionerv1.ComposeResponse) []*provisionerv1.Provision {
	var pending []*provisionerv1.Provision
	for _, p := range composition.GetProvisions() {
		if !IsBound(p) {
			pending = append(pending, p)
		}
	}
	return pending
}

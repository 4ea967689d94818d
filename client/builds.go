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

// Pending returns the provisions of a composition that their providers
// have not bound yet.
func Pending(composition *provisionerv1.ComposeResponse) []*provisionerv1.Provision {
	var pending []*provisionerv1.Provision
	for _, p := range composition.GetProvisions() {
		if p.GetBoundRevision() == 0 {
			pending = append(pending, p)
		}
	}
	return pending
}

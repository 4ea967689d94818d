package client

import (
	"slices"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// The rule of joining pages, the same in every client (docs/protocol.md,
// "Joining pages"): records concatenated in page order; a module's plan that
// a page continues is one plan; the revisions (revision) are the last
// page's, the newest; behind is every bucket any page named, once, in the
// order first named; phases are the first page's, each page timing only its
// own part.

// JoinProvisioningPages joins the pages of a provisioning answer into one.
func JoinProvisioningPages(pages []*provisionerv1.ProvisioningResponse) *provisionerv1.ProvisioningResponse {
	whole := &provisionerv1.ProvisioningResponse{}
	for _, page := range pages {
		whole.What, whole.Revision = page.GetWhat(), page.GetRevision()
		whole.Registry = append(whole.Registry, page.GetRegistry()...)
		whole.Needs = append(whole.Needs, page.GetNeeds()...)
		whole.Applied = append(whole.Applied, page.GetApplied()...)
		whole.Collect = append(whole.Collect, page.GetCollect()...)
		whole.Manifests = append(whole.Manifests, page.GetManifests()...)
		whole.Malformed = append(whole.Malformed, page.GetMalformed()...)
		whole.Behind = union(whole.GetBehind(), page.GetBehind())
	}
	return whole
}

// JoinComposePages joins the pages of a composition into one.
func JoinComposePages(pages []*provisionerv1.ComposeResponse) *provisionerv1.ComposeResponse {
	whole := &provisionerv1.ComposeResponse{}
	for i, page := range pages {
		plans := page.GetPlans()
		if n := len(whole.GetPlans()); n > 0 && len(plans) > 0 && whole.GetPlans()[n-1].GetModule() == plans[0].GetModule() {
			last := whole.GetPlans()[n-1]
			// A fresh plan: the pages' own stay as they came.
			whole.Plans[n-1] = &provisionerv1.ModulePlan{Module: last.GetModule(), Items: slices.Concat(last.GetItems(), plans[0].GetItems()),
				WantedBuild: last.GetWantedBuild(), NewestBuild: last.GetNewestBuild()}
			plans = plans[1:]
		}
		whole.Plans = append(whole.Plans, plans...)
		whole.Provisions = append(whole.Provisions, page.GetProvisions()...)
		whole.Refusals = append(whole.Refusals, page.GetRefusals()...)
		whole.Node, whole.Module, whole.Revisions = page.GetNode(), page.GetModule(), page.GetRevisions()
		whole.PlanDigest = page.GetPlanDigest() // every page's is the whole composition's
		whole.Behind = union(whole.GetBehind(), page.GetBehind())
		if i == 0 {
			whole.Phases = page.GetPhases()
		}
	}
	return whole
}

// JoinProvisionsPages joins the pages of a provider's provisions into one.
func JoinProvisionsPages(pages []*provisionerv1.ProvisionsResponse) *provisionerv1.ProvisionsResponse {
	whole := &provisionerv1.ProvisionsResponse{}
	for _, page := range pages {
		whole.Provider, whole.Revisions = page.GetProvider(), page.GetRevisions()
		whole.Provisions = append(whole.Provisions, page.GetProvisions()...)
		whole.Behind = union(whole.GetBehind(), page.GetBehind())
	}
	return whole
}

// union appends to a the names of b it does not hold yet.
func union(a, b []string) []string {
	for _, name := range b {
		if !slices.Contains(a, name) {
			a = append(a, name)
		}
	}
	return a
}

package compose

import (
	"crypto/sha256"
	"encoding/hex"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Digest returns the digest of what a composition asks the node to apply:
// "sha256:" and the hex SHA-256 of the composition's deterministic
// encoding without its phases, revisions, behind, page token, digest and
// the revisions at which needs and items were written. A need or item
// written again unchanged leaves it as it was; a provision bound again (a
// new revision of the provider's key) changes it: the value to read
// changed. Deterministic encoding is stable for one build of the protobuf
// library; every instance of a release computes the same digest. It is
// empty for a composition that does not encode.
func Digest(c *provisionerv1.ComposeResponse) string {
	plans := make([]*provisionerv1.ModulePlan, len(c.GetPlans()))
	for i, p := range c.GetPlans() {
		items := make([]*provisionerv1.PlanItem, len(p.GetItems()))
		for j, item := range p.GetItems() {
			it := &provisionerv1.PlanItem{
				Kind: item.GetKind(), Name: item.GetName(), Placeholder: item.GetPlaceholder(), Owner: item.GetOwner(),
				Location: item.GetLocation(), Collection: item.GetCollection(), Builds: item.GetBuilds(),
			}
			for _, collected := range item.GetItems() {
				it.Items = append(it.Items, &provisionerv1.CollectedItem{Contributor: collected.GetContributor(), Item: collected.GetItem()})
			}
			items[j] = it
		}
		plans[i] = &provisionerv1.ModulePlan{Module: p.GetModule(), Items: items, WantedBuild: p.GetWantedBuild(), NewestBuild: p.GetNewestBuild()}
	}
	stripped := &provisionerv1.ComposeResponse{
		Node: c.GetNode(), Module: c.GetModule(), Plans: plans, Provisions: c.GetProvisions(), Refusals: c.GetRefusals(),
	}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(stripped)
	if err != nil {
		// Its strings came from decoded messages, valid UTF-8: the answer
		// itself would not encode either.
		return ""
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

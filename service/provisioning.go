package service

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// handleProvisioning answers mesh-provisioner.provisioning.
func (s *Service) handleProvisioning(req micro.Request) {
	var in provisionerv1.ProvisioningRequest
	s.handle(req, s.counters[ProvisioningEndpoint], &in,
		func() *codedError { return checkRequest(&in) },
		func() []revisionWait { return []revisionWait{{s.mirror.copyOf(whatOf(&in)), in.GetMinRevision()}} },
		func(time.Duration) proto.Message { return provisioningFrom(s.mirror, &in) })
}

// filtersOf says which filters narrow each what, in request order.
var filtersOf = map[provisionerv1.What][]string{
	provisionerv1.What_WHAT_REGISTRY: nil,
	provisionerv1.What_WHAT_NEEDS:    {"node", "module"},
	provisionerv1.What_WHAT_APPLIED:  {"node", "module"},
	provisionerv1.What_WHAT_COLLECT:  {"node", "contributor", "collection"},
}

// checkRequest refuses an unknown what, a filter that does not apply to it,
// and a filter value that no key could hold.
func checkRequest(in *provisionerv1.ProvisioningRequest) *codedError {
	what := whatOf(in)
	allowed, ok := filtersOf[what]
	if !ok {
		return badRequest(fmt.Sprintf("what %d is not one of WHAT_REGISTRY, WHAT_NEEDS, WHAT_APPLIED, WHAT_COLLECT", in.GetWhat()))
	}
	set := []struct{ name, value string }{
		{"node", in.GetNode()}, {"module", in.GetModule()}, {"contributor", in.GetContributor()}, {"collection", in.GetCollection()},
	}
	for _, f := range set {
		if f.value == "" {
			continue
		}
		if !slices.Contains(allowed, f.name) {
			narrowedBy := "nothing"
			if len(allowed) > 0 {
				narrowedBy = strings.Join(allowed, ", ")
			}
			return badRequest(fmt.Sprintf("filter %s does not apply to %s, which is narrowed by %s; leave %s out", f.name, what, narrowedBy, f.name))
		}
		if f.name == "collection" {
			continue // any readable name; the key holds it escaped
		}
		if err := keys.CheckToken(f.value); err != nil {
			return badRequest(fmt.Sprintf("filter %s %q can match no key: it %v", f.name, f.value, err))
		}
	}
	return nil
}

func whatOf(in *provisionerv1.ProvisioningRequest) provisionerv1.What {
	if in.GetWhat() == provisionerv1.What_WHAT_UNSPECIFIED {
		return provisionerv1.What_WHAT_REGISTRY
	}
	return in.GetWhat()
}

// provisioningFrom answers a checked request from a copy.
func provisioningFrom(m *mirror, in *provisionerv1.ProvisioningRequest) *provisionerv1.ProvisioningResponse {
	out := &provisionerv1.ProvisioningResponse{What: whatOf(in)}
	// A malformed key is kept unless one of its tokens contradicts a filter;
	// a key too short to have the filter's token is kept.
	tokenIs := func(tokens []string, i int, want string) bool {
		return want == "" || i >= len(tokens) || tokens[i] == want
	}
	switch out.What {
	case provisionerv1.What_WHAT_REGISTRY:
		out.Registry, out.Malformed, out.Revision = m.registry.read(selection[*provisionerv1.RegistryRecord]{})
	case provisionerv1.What_WHAT_NEEDS:
		out.Needs, out.Malformed, out.Revision = m.needs.read(selection[*provisionerv1.NeedRecord]{
			first: in.GetNode(),
			keep:  func(r *provisionerv1.NeedRecord) bool { return in.GetModule() == "" || r.GetModule() == in.GetModule() },
			keepMalformed: func(tokens []string) bool {
				return tokenIs(tokens, 1, in.GetModule())
			},
		})
	case provisionerv1.What_WHAT_APPLIED:
		out.Applied, out.Malformed, out.Revision = m.applied.read(selection[*provisionerv1.AppliedRecord]{
			first: in.GetNode(),
			keep: func(r *provisionerv1.AppliedRecord) bool {
				return in.GetModule() == "" || r.GetModule() == in.GetModule()
			},
			keepMalformed: func(tokens []string) bool {
				return tokenIs(tokens, 1, in.GetModule())
			},
		})
	case provisionerv1.What_WHAT_COLLECT:
		collection := ""
		if in.GetCollection() != "" {
			collection = keys.Escape(in.GetCollection())
		}
		out.Collect, out.Malformed, out.Revision = m.collect.read(selection[*provisionerv1.CollectRecord]{
			first: in.GetNode(),
			keep: func(r *provisionerv1.CollectRecord) bool {
				return (in.GetCollection() == "" || r.GetCollection() == in.GetCollection()) &&
					(in.GetContributor() == "" || r.GetContributor() == in.GetContributor())
			},
			keepMalformed: func(tokens []string) bool {
				return tokenIs(tokens, 1, collection) && tokenIs(tokens, 2, in.GetContributor())
			},
		})
	}
	return out
}

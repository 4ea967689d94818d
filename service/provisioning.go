package service

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/micro"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// handleProvisioning reads and checks a request on the micro callback, so
// that micro counts every refusal, then builds the answer on a worker: the
// callback is free for the next request while a large answer is encoded.
func (s *Service) handleProvisioning(req micro.Request) {
	enc := encodingOf(req)
	var in provisionerv1.ProvisioningRequest
	if cerr := enc.unmarshal(req.Data(), &in); cerr != nil {
		s.refuse(req, enc, cerr)
		return
	}
	if cerr := checkRequest(&in); cerr != nil {
		s.refuse(req, enc, cerr)
		return
	}
	if loading := s.mirror.loading(); len(loading) > 0 {
		s.refuse(req, enc, &codedError{CodeNotReady, fmt.Sprintf("the server is still loading its copy of %s; ask again shortly", strings.Join(loading, ", "))})
		return
	}
	s.slots <- struct{}{}
	s.answers.Add(1)
	go func() {
		defer func() { <-s.slots; s.answers.Done() }()
		s.answer(req, enc, &in)
	}()
}

func (s *Service) answer(req micro.Request, enc encoding, in *provisionerv1.ProvisioningRequest) {
	data, err := enc.marshal(s.provisioning(in))
	if err != nil {
		s.answerErrors.Add(1)
		s.logger.Error("encoding an answer failed", "err", err)
		s.refuse(req, enc, &codedError{CodeInternal, "the server could not encode its answer; see its log"})
		return
	}
	if err := req.Respond(data, micro.WithHeaders(enc.headers())); err != nil {
		s.answerErrors.Add(1)
		s.logger.Warn("sending an answer failed", "err", err, "bytes", len(data))
		return
	}
	s.answered.Add(1)
}

func (s *Service) refuse(req micro.Request, enc encoding, cerr *codedError) {
	s.logger.Debug("request refused", "code", cerr.code, "reason", cerr.sentence)
	if err := req.Error(strconv.Itoa(cerr.code), cerr.sentence, nil, micro.WithHeaders(enc.headers())); err != nil {
		s.logger.Warn("sending an error failed", "err", err)
	}
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

// provisioning answers a checked request from the copy.
func (s *Service) provisioning(in *provisionerv1.ProvisioningRequest) *provisionerv1.ProvisioningResponse {
	out := &provisionerv1.ProvisioningResponse{What: whatOf(in)}
	// A malformed key is kept unless one of its tokens contradicts a filter;
	// a key too short to have the filter's token is kept.
	tokenIs := func(tokens []string, i int, want string) bool {
		return want == "" || i >= len(tokens) || tokens[i] == want
	}
	switch out.What {
	case provisionerv1.What_WHAT_REGISTRY:
		out.Registry, out.Malformed, out.Revision = s.mirror.registry.read(selection[*provisionerv1.RegistryRecord]{})
	case provisionerv1.What_WHAT_NEEDS:
		out.Needs, out.Malformed, out.Revision = s.mirror.needs.read(selection[*provisionerv1.NeedRecord]{
			first: in.GetNode(),
			keep:  func(r *provisionerv1.NeedRecord) bool { return in.GetModule() == "" || r.GetModule() == in.GetModule() },
			keepMalformed: func(tokens []string) bool {
				return tokenIs(tokens, 1, in.GetModule())
			},
		})
	case provisionerv1.What_WHAT_APPLIED:
		out.Applied, out.Malformed, out.Revision = s.mirror.applied.read(selection[*provisionerv1.AppliedRecord]{
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
		out.Collect, out.Malformed, out.Revision = s.mirror.collect.read(selection[*provisionerv1.CollectRecord]{
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

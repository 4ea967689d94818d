package answers

import (
	"time"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/wire"
)

// provisionsEndpoint answers mesh-provisioner.provisions.<provider>: what a
// provider must provision across the mesh, which is what it needs instead of
// reading every node's needs.
func (s *Answers) provisionsEndpoint() Verb[*provisionerv1.ProvisionsRequest, *provisionerv1.ProvisionsResponse] {
	return Verb[*provisionerv1.ProvisionsRequest, *provisionerv1.ProvisionsResponse]{
		Name:       wire.ProvisionsEndpoint,
		Subject:    wire.ProvisionsSubject,
		NewRequest: func() *provisionerv1.ProvisionsRequest { return &provisionerv1.ProvisionsRequest{} },
		Check:      checkProvisions,
		Waits: func(in *provisionerv1.ProvisionsRequest) []RevisionWait {
			least := in.GetMinRevisions()
			waits := []RevisionWait{{s.mirror.Registry, least.GetRegistry()}, {s.mirror.Needs, least.GetNeeds()}}
			// checkProvisions read the token already: it decodes.
			if t, _ := readToken(in.GetPageToken(), func() string { return provisionsDigest(in) }); len(t.Revisions) == len(waits) {
				for i, rev := range t.Revisions {
					waits = append(waits, RevisionWait{waits[i].bucket, rev})
				}
			}
			// checkProvisions checked the provider's name.
			return append(waits, providerUnread(s.mirror, in.GetProvider())...)
		},
		Unavailable: func(*provisionerv1.ProvisionsRequest) *wire.Error {
			if s.mirror.Registry.Empty() {
				return wire.NewError(wire.CodeUnavailable, "the registry is empty: the instance that holds the provisioner seat has not written it yet; ask again shortly")
			}
			return nil
		},
		KeyOf: func(in *provisionerv1.ProvisionsRequest) string {
			least := in.GetMinRevisions()
			in.MinRevisions = nil
			defer func() { in.MinRevisions = least }()
			return requestKey(in)
		},
		StampOf: func(*provisionerv1.ProvisionsRequest) Stamp {
			registry, _ := s.mirror.Registry.Stamp("")
			needs, _ := s.mirror.Needs.Stamp("")
			applied, _ := s.mirror.Applied.Stamp("")
			manifests, _ := s.mirror.Manifests.Stamp("")
			return Stamp{registry: registry, needs: needs, applied: applied, manifests: manifests,
				bound: s.mirror.Bound.Stamp(), behind: behindBits(s.mirror)}
		},
		Answer: func(in *provisionerv1.ProvisionsRequest, enc Encoding, budget Budget) (*provisionerv1.ProvisionsResponse, Timings, func(), *wire.Error) {
			out, t, werr := provisionsFrom(s.mirror, s.partitions, in, enc, budget)
			return out, t, nil, werr
		},
		PartitionOf: func(in *provisionerv1.ProvisionsRequest) (int, bool) {
			// checkProvisions read the token already: it decodes.
			t, _ := readToken(in.GetPageToken(), func() string { return provisionsDigest(in) })
			return t.Partition, s.partitions.partial()
		},
		Tail: func(in *provisionerv1.ProvisionsRequest, _ Timings, revs mirror.Revisions) *provisionerv1.ProvisionsResponse {
			return &provisionerv1.ProvisionsResponse{Revisions: revs.Only(providerBuckets(s.mirror, in.GetProvider())).Proto()}
		},
	}
}

func checkProvisions(in *provisionerv1.ProvisionsRequest) *wire.Error {
	if in.GetProvider() == "" {
		return wire.NewError(wire.CodeBadRequest, "provider is required: the provider whose provisions to list, as the subject names it")
	}
	if werr := admission.CheckName("provider", in.GetProvider(), true); werr != nil {
		return werr
	}
	_, werr := readToken(in.GetPageToken(), func() string { return provisionsDigest(in) })
	return werr
}

// provisionsDigest identifies a provisions request for its page tokens.
func provisionsDigest(in *provisionerv1.ProvisionsRequest) string {
	return requestDigest(&provisionerv1.ProvisionsRequest{Provider: in.GetProvider()})
}

// provisionsFrom lists a provider's provisions from the copy, need by need in
// key order across the mesh (partition by partition on an instance that
// holds some, ps), a page at a time.
func provisionsFrom(m *mirror.Mirror, ps partitions, in *provisionerv1.ProvisionsRequest, enc Encoding, budget Budget) (*provisionerv1.ProvisionsResponse, Timings, *wire.Error) {
	token, werr := readToken(in.GetPageToken(), func() string { return provisionsDigest(in) })
	if werr == nil {
		werr = sameWalk(in.GetPageToken(), token, ps)
	}
	if werr != nil {
		return nil, Timings{}, werr
	}
	start := time.Now()
	// Read before the needs: they are at least as new. Each node's needs
	// are decoded as the page reaches them, not every node's at once.
	revs := &provisionerv1.Revisions{Registry: m.Registry.Revision(), Needs: m.Needs.Revision()}
	out := &provisionerv1.ProvisionsResponse{Provider: in.GetProvider()}
	find := compose.NewProvisionsOf(in.GetProvider(), m.Sources(nil))
	p := &page{enc: enc, size: int(in.GetPageSize()), budget: budget.Fill, most: budget.Most, used: pageOverhead}
	next := pageToken{Request: provisionsDigest(in), Revisions: []uint64{revs.GetRegistry(), revs.GetNeeds()}, Walk: ps.partial()}
	at, more := ps.walk(token.Partition, func(part int, ofPart func(string) bool) bool {
		previous := ""
		if part == token.Partition {
			previous = token.After
		}
		for e := range m.Needs.After(previous) {
			if ofPart != nil && !ofPart(firstOf(e.Key)) {
				continue
			}
			if e.Malformed == nil {
				if provision := find.Need(e.Record); provision != nil {
					if !p.fits(p.sizeOf(provision)) {
						if p.count == 0 {
							werr = wire.Errorf(wire.CodeInternal, "need %s alone asks a provision of %d bytes, more than one answer carries (max_payload)", e.Key, p.sizeOf(provision))
							return true
						}
						next.Partition, next.After = part, previous
						out.NextPageToken = next.encode()
						return true
					}
					out.Provisions = append(out.Provisions, provision)
				}
			}
			previous = e.Key
		}
		return false
	})
	if werr != nil {
		return nil, Timings{}, werr
	}
	if more {
		next.Partition = at
		out.NextPageToken = next.encode()
	}
	out.Behind = append(m.Behind(), boundBehind(m, out.GetProvisions())...)
	return out, Timings{resolve: time.Since(start)}, nil
}

package answers

import (
	"slices"
	"sort"
	"strings"
	"time"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/wire"
)

// provisioningEndpoint answers mesh-provisioner.provisioning.
func (s *Answers) provisioningEndpoint() Verb[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse] {
	return Verb[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse]{
		Name:       wire.ProvisioningEndpoint,
		Subject:    wire.ProvisioningSubject,
		NewRequest: func() *provisionerv1.ProvisioningRequest { return &provisionerv1.ProvisioningRequest{} },
		Check:      checkProvisioning,
		Waits: func(in *provisionerv1.ProvisioningRequest) []RevisionWait {
			return provisioningWaits(s.mirror, in)
		},
		KeyOf: func(in *provisionerv1.ProvisioningRequest) string {
			least := in.GetMinRevision()
			in.MinRevision = 0
			defer func() { in.MinRevision = least }()
			return requestKey(in)
		},
		StampOf: func(in *provisionerv1.ProvisioningRequest) Stamp {
			st, _ := copyOf(s.mirror, WhatOf(in)).Stamp(in.GetNode())
			read := Stamp{behind: behindBits(s.mirror)}
			switch WhatOf(in) {
			case provisionerv1.What_WHAT_NEEDS:
				read.needs = st
			case provisionerv1.What_WHAT_APPLIED:
				read.applied = st
			case provisionerv1.What_WHAT_COLLECT:
				read.collect = st
			case provisionerv1.What_WHAT_MANIFESTS:
				read.manifests = st
			default:
				read.registry = st
			}
			return read
		},
		Answer: provisioningAnswer(s.mirror, s.partitions),
		PartitionOf: func(in *provisionerv1.ProvisioningRequest) (int, bool) {
			if !walksNodes(in) {
				return s.partitions.of(in.GetNode())
			}
			// checkProvisioning read the token already: it decodes.
			t, _ := readToken(in.GetPageToken(), func() string { return provisioningDigest(in) })
			return t.Partition, s.partitions.partial()
		},
		Early: s.provisioningEarly,
		Tail:  provisioningTail,
	}
}

// provisioningWaits are the revisions a provisioning request asks m to
// reach: its min_revision and its page token's, of the bucket it reads.
func provisioningWaits(m *mirror.Mirror, in *provisionerv1.ProvisioningRequest) []RevisionWait {
	c := copyOf(m, WhatOf(in))
	waits := []RevisionWait{{c, in.GetMinRevision()}}
	// checkProvisioning read the token already: it decodes.
	if t, _ := readToken(in.GetPageToken(), func() string { return provisioningDigest(in) }); len(t.Revisions) == 1 {
		waits = append(waits, RevisionWait{c, t.Revisions[0]})
	}
	return waits
}

// provisioningTail is the tail of a provisioning answer: the revision of
// the bucket it read.
func provisioningTail(in *provisionerv1.ProvisioningRequest, _ Timings, revs mirror.Revisions) *provisionerv1.ProvisioningResponse {
	return &provisionerv1.ProvisioningResponse{Revision: revisionOf(revs, WhatOf(in))}
}

// provisioningAnswer answers a provisioning request from m, which holds
// the partitions ps says.
func provisioningAnswer(m *mirror.Mirror, ps partitions) func(*provisionerv1.ProvisioningRequest, Encoding, Budget) (*provisionerv1.ProvisioningResponse, Timings, func(), *wire.Error) {
	return func(in *provisionerv1.ProvisioningRequest, enc Encoding, budget Budget) (*provisionerv1.ProvisioningResponse, Timings, func(), *wire.Error) {
		start := time.Now()
		out, werr := provisioningFrom(m, ps, in, enc, budget)
		return out, Timings{read: time.Since(start)}, nil, werr
	}
}

// filtersOf says which filters narrow each what, in request order.
var filtersOf = map[provisionerv1.What][]string{
	provisionerv1.What_WHAT_REGISTRY: nil,
	provisionerv1.What_WHAT_NEEDS:    {"node", "module"},
	provisionerv1.What_WHAT_APPLIED:  {"node", "module"},
	provisionerv1.What_WHAT_COLLECT:  {"node", "contributor", "collection"},
	// A provider is a module: module narrows manifests by provider.
	provisionerv1.What_WHAT_MANIFESTS: {"node", "module"},
}

// checkProvisioning refuses an unknown what, a filter that does not apply to
// it, a filter value that no key could hold, and a page token that is not
// this request's.
func checkProvisioning(in *provisionerv1.ProvisioningRequest) *wire.Error {
	what := WhatOf(in)
	allowed, ok := filtersOf[what]
	if !ok {
		return wire.Errorf(wire.CodeBadRequest, "what %d is not one of WHAT_REGISTRY, WHAT_NEEDS, WHAT_APPLIED, WHAT_COLLECT, WHAT_MANIFESTS", in.GetWhat())
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
			return wire.Errorf(wire.CodeBadRequest, "filter %s does not apply to %s, which is narrowed by %s; leave %s out", f.name, what, narrowedBy, f.name)
		}
		// A collection is any readable name; the key holds it escaped.
		if werr := admission.CheckName("filter "+f.name, f.value, f.name != "collection"); werr != nil {
			return werr
		}
	}
	_, werr := readToken(in.GetPageToken(), func() string { return provisioningDigest(in) })
	return werr
}

// provisioningDigest identifies a provisioning request for its page tokens.
func provisioningDigest(in *provisionerv1.ProvisioningRequest) string {
	return requestDigest(&provisionerv1.ProvisioningRequest{
		What: WhatOf(in), Node: in.GetNode(), Module: in.GetModule(), Contributor: in.GetContributor(), Collection: in.GetCollection(),
	})
}

// WhatOf returns the bucket a provisioning request reads: the registry
// when it names none.
func WhatOf(in *provisionerv1.ProvisioningRequest) provisionerv1.What {
	if in.GetWhat() == provisionerv1.What_WHAT_UNSPECIFIED {
		return provisionerv1.What_WHAT_REGISTRY
	}
	return in.GetWhat()
}

// copyOf returns the copy of the bucket a what reads.
func copyOf(m *mirror.Mirror, what provisionerv1.What) mirror.Watched {
	switch what {
	case provisionerv1.What_WHAT_NEEDS:
		return m.Needs
	case provisionerv1.What_WHAT_APPLIED:
		return m.Applied
	case provisionerv1.What_WHAT_COLLECT:
		return m.Collect
	case provisionerv1.What_WHAT_MANIFESTS:
		return m.Manifests
	}
	return m.Registry
}

// provisioningFrom answers a checked request from a mirror: one page of it,
// at most budget bytes once encoded, without the revision, which is added as
// the answer is sent. A listing of every node's records reads the nodes of
// the partitions the copy holds (ps), partition by partition.
func provisioningFrom(m *mirror.Mirror, ps partitions, in *provisionerv1.ProvisioningRequest, enc Encoding, budget Budget) (*provisionerv1.ProvisioningResponse, *wire.Error) {
	token, werr := readToken(in.GetPageToken(), func() string { return provisioningDigest(in) })
	if werr != nil {
		return nil, werr
	}
	out := &provisionerv1.ProvisioningResponse{What: WhatOf(in), Behind: m.Behind()}
	p := &page{enc: enc, size: int(in.GetPageSize()), budget: budget.Fill, most: budget.Most, used: pageOverhead}
	// A malformed key is kept unless one of its tokens contradicts a filter;
	// a key too short to have the filter's token is kept.
	tokenIs := func(tokens []string, i int, want string) bool {
		return want == "" || i >= len(tokens) || tokens[i] == want
	}
	// list adds to the page the records after the key after, of the nodes
	// ofPart keeps (nil: every node), and returns the page's last key
	// when more follow.
	var list func(after string, ofPart func(string) bool) (string, *wire.Error)
	var malformed []*provisionerv1.MalformedKey
	switch out.GetWhat() {
	case provisionerv1.What_WHAT_REGISTRY:
		list = func(after string, _ func(string) bool) (next string, werr *wire.Error) {
			out.Registry, malformed, next, werr = fill(m.Registry, p, after, "", nil, nil, nil)
			return next, werr
		}
	case provisionerv1.What_WHAT_NEEDS:
		list = func(after string, ofPart func(string) bool) (next string, werr *wire.Error) {
			var records []*provisionerv1.NeedRecord
			records, malformed, next, werr = fill(m.Needs, p, after, in.GetNode(), ofPart,
				func(r *provisionerv1.NeedRecord) bool { return in.GetModule() == "" || r.GetModule() == in.GetModule() },
				func(tokens []string) bool { return tokenIs(tokens, 1, in.GetModule()) })
			out.Needs = append(out.Needs, records...)
			return next, werr
		}
	case provisionerv1.What_WHAT_APPLIED:
		list = func(after string, ofPart func(string) bool) (next string, werr *wire.Error) {
			var records []*provisionerv1.AppliedRecord
			records, malformed, next, werr = fill(m.Applied, p, after, in.GetNode(), ofPart,
				func(r *provisionerv1.AppliedRecord) bool {
					return in.GetModule() == "" || r.GetModule() == in.GetModule()
				},
				func(tokens []string) bool { return tokenIs(tokens, 1, in.GetModule()) })
			out.Applied = append(out.Applied, records...)
			return next, werr
		}
	case provisionerv1.What_WHAT_COLLECT:
		collection := ""
		if in.GetCollection() != "" {
			collection = keys.Escape(in.GetCollection())
		}
		list = func(after string, ofPart func(string) bool) (next string, werr *wire.Error) {
			var records []*provisionerv1.CollectRecord
			records, malformed, next, werr = fill(m.Collect, p, after, in.GetNode(), ofPart,
				func(r *provisionerv1.CollectRecord) bool {
					return (in.GetCollection() == "" || r.GetCollection() == in.GetCollection()) &&
						(in.GetContributor() == "" || r.GetContributor() == in.GetContributor())
				},
				func(tokens []string) bool {
					return tokenIs(tokens, 1, collection) && tokenIs(tokens, 2, in.GetContributor())
				})
			out.Collect = append(out.Collect, records...)
			return next, werr
		}
	case provisionerv1.What_WHAT_MANIFESTS:
		list = func(after string, _ func(string) bool) (next string, werr *wire.Error) {
			out.Manifests, malformed, next, werr = fill(m.Manifests, p, after, in.GetNode(), nil,
				func(r *provisionerv1.ManifestRecord) bool {
					return in.GetModule() == "" || r.GetProvider() == in.GetModule()
				},
				func(tokens []string) bool { return tokenIs(tokens, 1, in.GetModule()) })
			return next, werr
		}
	}
	if !walksNodes(in) {
		ps = partitions{} // what every instance holds, or one node's
	}
	if werr := sameWalk(in.GetPageToken(), token, ps); werr != nil {
		return nil, werr
	}
	next := pageToken{Request: provisioningDigest(in), Revisions: []uint64{copyOf(m, out.GetWhat()).Revision()}, Walk: ps.partial()}
	at, more := ps.walk(token.Partition, func(part int, ofPart func(string) bool) bool {
		after := ""
		if part == token.Partition {
			after = token.After
		}
		var last string
		last, werr = list(after, ofPart)
		out.Malformed = append(out.Malformed, malformed...)
		// Full, the page ends after its last key, or, full before any
		// key of this partition, at its start.
		if werr == nil && p.full {
			next.Partition, next.After = part, last
			out.NextPageToken = next.encode()
		}
		return werr != nil || p.full
	})
	if werr != nil {
		return nil, werr
	}
	if more {
		next.Partition = at
		out.NextPageToken = next.encode()
	}
	return out, nil
}

// walksNodes reports whether a provisioning request lists the records of
// every node: of a state bucket, with no node named.
func walksNodes(in *provisionerv1.ProvisioningRequest) bool {
	what := WhatOf(in)
	return in.GetNode() == "" && what != provisionerv1.What_WHAT_REGISTRY && what != provisionerv1.What_WHAT_MANIFESTS
}

// pageOverhead is what a page reserves for everything but its items: the
// answer's other fields and its next_page_token.
const pageOverhead = 512

// fill reads the entries after the key after, of the group first (every
// group when empty, of the groups ofPart keeps if set), keeps those the
// filters keep, and adds them to the page
// while they fit. It returns the page's records and malformed keys, the
// last key of the page when more entries follow.
func fill[R proto.Message](c *mirror.Copy[R], p *page, after, first string, ofPart func(string) bool, keep func(R) bool, keepMalformed func([]string) bool) (records []R, malformed []*provisionerv1.MalformedKey, next string, werr *wire.Error) {
	// Every group's, decoded as the page reaches it; or one group's, whose
	// view is kept for the reads that follow.
	entries := c.After(after)
	if first != "" {
		group, _, _ := c.Group(first)
		start := sort.Search(len(group), func(i int) bool { return group[i].Key > after })
		entries = slices.Values(group[start:])
	}
	last := ""
	for e := range entries {
		if ofPart != nil && !ofPart(firstOf(e.Key)) {
			continue
		}
		var item proto.Message
		switch {
		case e.Malformed != nil && (keepMalformed == nil || keepMalformed(e.Tokens())):
			item = e.Malformed
		case e.Malformed == nil && (keep == nil || keep(e.Record)):
			item = e.Record
		default:
			continue
		}
		if !p.fits(p.sizeOf(item)) {
			if p.count == 0 {
				return nil, nil, "", wire.Errorf(wire.CodeInternal, "key %s alone is %d bytes, more than one answer carries (max_payload); the bucket's value size limit should not allow it", e.Key, p.sizeOf(item))
			}
			return records, malformed, last, nil
		}
		if e.Malformed != nil {
			malformed = append(malformed, e.Malformed)
		} else {
			records = append(records, e.Record)
		}
		last = e.Key
	}
	return records, malformed, "", nil
}

// requestKey is a request's bytes, as a map key.
func requestKey(req proto.Message) string {
	b, _ := deterministic.Marshal(req)
	return string(b)
}

// revisionOf returns the revision of the bucket what reads.
func revisionOf(revs mirror.Revisions, what provisionerv1.What) uint64 {
	switch what {
	case provisionerv1.What_WHAT_NEEDS:
		return revs.Needs
	case provisionerv1.What_WHAT_APPLIED:
		return revs.Applied
	case provisionerv1.What_WHAT_COLLECT:
		return revs.Collect
	case provisionerv1.What_WHAT_MANIFESTS:
		return revs.Manifests
	default:
		return revs.Registry
	}
}

// behindBits says which copies are behind, one bit each.
func behindBits(m *mirror.Mirror) uint64 {
	var bits uint64
	for i, c := range m.Copies() {
		if c.Behind() {
			bits |= 1 << i
		}
	}
	return bits
}

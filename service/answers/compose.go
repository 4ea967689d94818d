package answers

import (
	"context"
	"log/slog"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/wire"
)

// composeEndpoint answers mesh-provisioner.compose.
func (s *Answers) composeEndpoint() Verb[*provisionerv1.ComposeRequest, *provisionerv1.ComposeResponse] {
	return Verb[*provisionerv1.ComposeRequest, *provisionerv1.ComposeResponse]{
		Name:       wire.ComposeEndpoint,
		Subject:    wire.ComposeSubject,
		NewRequest: func() *provisionerv1.ComposeRequest { return &provisionerv1.ComposeRequest{} },
		Check:      checkCompose,
		Waits: func(in *provisionerv1.ComposeRequest) []RevisionWait {
			unread, buckets := s.boundUnread(in.GetNode())
			return append(composeWaits(s.mirror, in, buckets), unread...)
		},
		Unavailable: func(*provisionerv1.ComposeRequest) *wire.Error {
			if s.mirror.Registry.Empty() {
				return wire.NewError(wire.CodeUnavailable, "the registry is empty: the instance that holds the provisioner seat has not written it yet; ask again shortly")
			}
			return nil
		},
		KeyOf: func(in *provisionerv1.ComposeRequest) string {
			least := in.GetMinRevisions()
			in.MinRevisions = nil
			defer func() { in.MinRevisions = least }()
			return requestKey(in)
		},
		StampOf: func(in *provisionerv1.ComposeRequest) Stamp {
			registry, _ := s.mirror.Registry.Stamp("")
			needs, _ := s.mirror.Needs.Stamp(in.GetNode())
			items, _ := s.mirror.Collect.Stamp(in.GetNode())
			applied, _ := s.mirror.Applied.Stamp(in.GetNode())
			manifests, _ := s.mirror.Manifests.Stamp("")
			return Stamp{registry: registry, needs: needs, applied: applied, collect: items, manifests: manifests,
				bound: s.mirror.Bound.StampOf(in.GetNode()), behind: behindBits(s.mirror)}
		},
		PartitionOf: func(in *provisionerv1.ComposeRequest) (int, bool) { return s.partitions.of(in.GetNode()) },
		Encoded:     s.composeSections,
		Early:       s.composeEarly,
		Answer:      composeAnswer(s.mirror, keepViews),
		Tail: func(in *provisionerv1.ComposeRequest, t Timings, revs mirror.Revisions) *provisionerv1.ComposeResponse {
			tail := &provisionerv1.ComposeResponse{Revisions: revs.Only(s.boundBucketsOf(in.GetNode())).Proto(), Phases: phasesOf(t)}
			s.logSlow(in, tail.GetPhases(), t.waited+t.read+t.resolve+t.items)
			return tail
		},
	}
}

// composeWaits are the revisions a compose request asks m to reach: its
// min_revisions (of the providers' buckets, only those of its node's,
// ownBuckets, sorted: another's is not the node's to wait for, nor to
// learn the revision of) and its page token's.
func composeWaits(m *mirror.Mirror, in *provisionerv1.ComposeRequest, ownBuckets []string) []RevisionWait {
	least := in.GetMinRevisions()
	waits := []RevisionWait{
		{m.Registry, least.GetRegistry()},
		{m.Needs, least.GetNeeds()},
		{m.Applied, least.GetApplied()},
		{m.Collect, least.GetCollect()},
		{m.Manifests, least.GetManifests()},
	}
	// checkCompose read the token already: it decodes.
	if t, _ := readToken(in.GetPageToken(), func() string { return composeDigest(in) }); len(t.Revisions) == len(waits) {
		for i, rev := range t.Revisions {
			waits = append(waits, RevisionWait{waits[i].bucket, rev})
		}
	}
	for bucket, rev := range least.GetBound() {
		if _, own := slices.BinarySearch(ownBuckets, bucket); own {
			waits = append(waits, RevisionWait{m.Bound.Bucket(bucket), rev})
		}
	}
	return waits
}

// composeAnswer answers a compose request from m, in an arena of the pool.
func composeAnswer(m *mirror.Mirror, views viewUse) func(*provisionerv1.ComposeRequest, Encoding, Budget) (*provisionerv1.ComposeResponse, Timings, func(), *wire.Error) {
	return func(in *provisionerv1.ComposeRequest, enc Encoding, budget Budget) (*provisionerv1.ComposeResponse, Timings, func(), *wire.Error) {
		arena, done := pooledArena()
		out, t, werr := composeFrom(m, in, enc, budget, reading{views: views, arena: arena})
		if werr != nil {
			done()
			return nil, t, nil, werr
		}
		return out, t, done, nil
	}
}

// phasesOf returns the phases of a composition: wait, read, resolve and
// items if it was built; wait and "reused" (taking no time worth timing) if
// it was reused from the cache.
func phasesOf(t Timings) []*provisionerv1.Phase {
	phases := []*provisionerv1.Phase{{Name: "wait", Duration: durationpb.New(t.waited)}}
	if !t.built {
		return append(phases, &provisionerv1.Phase{Name: "reused", Duration: durationpb.New(0)})
	}
	return append(phases,
		&provisionerv1.Phase{Name: "read", Duration: durationpb.New(t.read)},
		&provisionerv1.Phase{Name: "resolve", Duration: durationpb.New(t.resolve)},
		&provisionerv1.Phase{Name: "items", Duration: durationpb.New(t.items)})
}

func checkCompose(in *provisionerv1.ComposeRequest) *wire.Error {
	if in.GetNode() == "" {
		return wire.NewError(wire.CodeBadRequest, "node is required: the node to compose")
	}
	if werr := admission.CheckName("node", in.GetNode(), true); werr != nil {
		return werr
	}
	if werr := admission.CheckName("module", in.GetModule(), true); werr != nil {
		return werr
	}
	for bucket := range in.GetMinRevisions().GetBound() {
		if werr := admission.CheckName("a bucket of min_revisions.bound", bucket, true); werr != nil {
			return werr
		}
	}
	_, werr := readToken(in.GetPageToken(), func() string { return composeDigest(in) })
	return werr
}

// composeDigest identifies a compose request for its page tokens.
func composeDigest(in *provisionerv1.ComposeRequest) string {
	return requestDigest(&provisionerv1.ComposeRequest{Node: in.GetNode(), Module: in.GetModule()})
}

// logSlow logs a composition slower than Config.SlowCompose, with its phases.
func (s *Answers) logSlow(in *provisionerv1.ComposeRequest, phases []*provisionerv1.Phase, took time.Duration) {
	if took <= s.slowCompose {
		return
	}
	s.warnings.Log(slog.LevelWarn, "slow composition", in.GetNode(), "slow composition", "node", in.GetNode(), "module", in.GetModule(), "took", took, "phases", phasesLog(phases))
}

func phasesLog(phases []*provisionerv1.Phase) slog.Value {
	attrs := make([]slog.Attr, len(phases))
	for i, p := range phases {
		attrs[i] = slog.Duration(p.GetName(), p.GetDuration().AsDuration())
	}
	return slog.GroupValue(attrs...)
}

// composeFrom composes one page of a node from a mirror: the needs after
// the token's key, in key order, chunk by chunk while they fit the page. The
// answer lacks its revisions and phases, which are added as it is sent.
// r says whether the node's decoded views are kept for later reads, and the
// arena the composition is made in.
func composeFrom(m *mirror.Mirror, in *provisionerv1.ComposeRequest, enc Encoding, budget Budget, r reading) (*provisionerv1.ComposeResponse, Timings, *wire.Error) {
	token, werr := readToken(in.GetPageToken(), func() string { return composeDigest(in) })
	if werr != nil {
		return nil, Timings{}, werr
	}
	if r.arena == nil {
		r.arena = new(compose.Arena) // the answer's own
	}
	start := time.Now()
	entries, _, needsRevision := groupOf(m.Needs, in.GetNode(), r.views)
	items, _, collectRevision := groupOf(m.Collect, in.GetNode(), r.views)
	builds, appliedRevision := m.BuildsOf(in.GetNode())
	revisions := &provisionerv1.Revisions{
		Registry:  m.Registry.Revision(),
		Needs:     needsRevision,
		Applied:   appliedRevision,
		Collect:   collectRevision,
		Manifests: m.Manifests.Revision(),
	}
	sources := m.Sources(&builds)
	records := mirror.WellFormed(make([]*provisionerv1.CollectRecord, 0, len(items)), items)
	// The needs this request composes (every page), and this page's: those
	// after the token's key. all is the view itself when it is every need:
	// it is only sliced, never appended to.
	all := entries
	if in.GetModule() != "" {
		all = nil
		for _, e := range entries {
			if moduleOf(e) == in.GetModule() {
				all = append(all, e)
			}
		}
	}
	needs := all[sort.Search(len(all), func(i int) bool { return all[i].Key > token.After }):]
	read := time.Since(start)

	out := &provisionerv1.ComposeResponse{Node: in.GetNode(), Module: in.GetModule()}
	p := &page{enc: enc, size: int(in.GetPageSize()), budget: budget.Fill, most: budget.Most, used: pageOverhead}
	var resolve, collect time.Duration
	done := 0
	// The needs are composed in chunks, each measured before it joins the
	// page: first all of them, which is one composition for any node whose
	// plan fits in a message; a chunk that does not fit is halved, down to
	// one need, and the next chunk is no larger than the last that fitted.
	// A page that holds something ends at the first need that does not fit.
	chunk := len(needs)
chunks:
	for done < len(needs) {
		n := min(chunk, len(needs)-done)
		if p.size > 0 {
			n = min(n, p.size-p.count)
		}
		if n <= 0 {
			break
		}
		for {
			part := composeNeeds(sources, in, needs[done:done+n], records, revisions, r.arena)
			size := p.sizeOf(&provisionerv1.ComposeResponse{Plans: part.GetPlans(), Provisions: part.GetProvisions(), Refusals: part.GetRefusals()})
			if p.takes(size, n) {
				p.used += size
				p.count += n
				merge(out, part)
				resolve += part.GetPhases()[0].GetDuration().AsDuration()
				collect += part.GetPhases()[1].GetDuration().AsDuration()
				done += n
				break
			}
			if n > 1 {
				n /= 2
				chunk = n
				continue
			}
			if p.count == 0 {
				return nil, Timings{}, wire.Errorf(wire.CodeInternal, "need %s alone composes to %d bytes, more than one answer carries (max_payload)", needs[done].Key, size)
			}
			break chunks
		}
	}
	if done < len(needs) {
		t := pageToken{Request: composeDigest(in), After: needs[done-1].Key,
			Revisions: []uint64{revisions.GetRegistry(), revisions.GetNeeds(), revisions.GetApplied(), revisions.GetCollect(), revisions.GetManifests()}}
		out.NextPageToken = t.encode()
	}
	out.Behind = append(m.Behind(), boundBehind(m, out.GetProvisions())...)
	// The digest is of the whole composition: this page's when it is all,
	// else the composition of every page, made once more.
	whole := out
	if len(needs) < len(all) || done < len(needs) {
		whole = composeNeeds(sources, in, all, records, revisions, r.arena)
	}
	out.PlanDigest = r.arena.Digest(whole)
	return out, Timings{read: read, resolve: resolve, items: collect}, nil
}

// reading is how a composition reads and builds: whether it keeps the
// node's decoded views, and the arena its messages are made in, for an
// answer encoded and then dropped (nil: the answer's own, for an answer
// its caller keeps, as a replay's).
type reading struct {
	views viewUse
	arena *compose.Arena
}

// arenas are the compositions' arenas, reused once their answers are
// encoded (or their digests read).
var arenas = sync.Pool{New: func() any { return new(compose.Arena) }}

// pooledArena returns an arena of the pool, and what resets it and puts it
// back, to call once nothing reads what was made in it.
func pooledArena() (arena *compose.Arena, done func()) {
	arena = arenas.Get().(*compose.Arena)
	return arena, func() {
		arena.Reset()
		arenas.Put(arena)
	}
}

// viewUse says whether a composition keeps the node's decoded views for
// the reads that follow (keepViews), as a request's does, or not
// (dropViews), as the plans writer's, which composes every node in turn.
type viewUse bool

const (
	keepViews viewUse = true
	dropViews viewUse = false
)

// groupOf reads a node's group of a copy as views says.
func groupOf[R proto.Message](c *mirror.Copy[R], node string, views viewUse) (entries []*mirror.Entry[R], changedAt, revision uint64) {
	if views == keepViews {
		return c.Group(node)
	}
	return c.GroupOnce(node)
}

// boundBehind returns the providers' buckets of provisions whose copy is
// behind, sorted.
func boundBehind(m *mirror.Mirror, provisions []*provisionerv1.Provision) []string {
	buckets := make([]string, len(provisions))
	for i, p := range provisions {
		buckets[i] = p.GetBucket()
	}
	return boundBucketsBehind(m, buckets)
}

// boundBucketsBehind returns the providers' buckets whose copy is behind,
// sorted, each once.
func boundBucketsBehind(m *mirror.Mirror, buckets []string) []string {
	var behind []string
	for _, b := range buckets {
		if !slices.Contains(behind, b) && m.Bound.Bucket(b).Behind() {
			behind = append(behind, b)
		}
	}
	slices.Sort(behind)
	return behind
}

// moduleOf returns the module token of a need key, well formed or not.
func moduleOf(e *mirror.Entry[*provisionerv1.NeedRecord]) string {
	if e.Malformed == nil {
		return e.Record.GetModule()
	}
	_, rest, _ := strings.Cut(e.Key, ".")
	module, _, _ := strings.Cut(rest, ".")
	return module
}

// boundUnread names to the copy the providers' buckets that the node's
// needs read, so that it follows them, and returns a wait for each it has
// not read yet: a provider met for the first time is read before the
// composition that names it is answered, not reported behind. It runs on
// the request's arrival, so it reads the node's needs only when they or
// the registry changed since it last named their buckets, a bucket is
// still unread, or the copy forgot a bucket (one of the node's, maybe,
// which it follows again only once named): a reused answer reads no need.
func (s *Answers) boundUnread(node string) (waits []RevisionWait, buckets []string) {
	m := s.mirror
	needs, _ := m.Needs.Stamp(node)
	registry, _ := m.Registry.Stamp("")
	at := [3]uint64{needs, registry, m.Bound.Forgotten()}
	if v, ok := s.boundNamed.Load(node); ok {
		if named := v.(boundNamed); named.at == at && m.Bound.AllLoaded() {
			return nil, named.buckets
		}
	}
	entries, _, _ := m.Needs.Group(node)
	buckets = namedBuckets(m, entries)
	for _, bucket := range buckets {
		if bb := m.Bound.Bucket(bucket); !bb.Loaded() {
			waits = append(waits, RevisionWait{boundLoaded{bb}, 1})
		}
	}
	s.boundNamed.Store(node, boundNamed{at: at, buckets: buckets})
	return waits, buckets
}

// namedBuckets returns the providers' buckets that needs name, sorted.
func namedBuckets(m *mirror.Mirror, needs []*mirror.Entry[*provisionerv1.NeedRecord]) []string {
	var buckets []string
	seen := map[string]bool{}
	for _, e := range needs {
		provider := e.Record.GetNeed().GetProvider()
		if e.Malformed != nil || provider == "" {
			continue
		}
		if bucket, ok := m.BoundBucketOf(e.Record.GetKind(), provider); ok && !seen[bucket] {
			seen[bucket] = true
			buckets = append(buckets, bucket)
		}
	}
	slices.Sort(buckets)
	return buckets
}

// boundNamed is what boundUnread last named for a node: the stamps it
// named them at, and the providers' buckets its needs name, sorted.
type boundNamed struct {
	at      [3]uint64
	buckets []string
}

// boundBucketsOf returns the providers' buckets node's needs name, as
// boundUnread last read them (on the request's arrival).
func (s *Answers) boundBucketsOf(node string) []string {
	if v, ok := s.boundNamed.Load(node); ok {
		return v.(boundNamed).buckets
	}
	return nil
}

// providerUnread is boundUnread for one provider's buckets (providerBuckets).
func providerUnread(m *mirror.Mirror, provider string) []RevisionWait {
	var waits []RevisionWait
	for _, bucket := range providerBuckets(m, provider) {
		if bb := m.Bound.Bucket(bucket); !bb.Loaded() {
			waits = append(waits, RevisionWait{boundLoaded{bb}, 1})
		}
	}
	return waits
}

// providerBuckets returns a provider's buckets, sorted: one for each
// registry entry that each provider answers.
func providerBuckets(m *mirror.Mirror, provider string) []string {
	var buckets []string
	entries, _ := m.Registry.All()
	for _, e := range entries {
		if bucket, ok := m.BoundBucketOf(e.Key, provider); ok && e.Malformed == nil && !slices.Contains(buckets, bucket) {
			buckets = append(buckets, bucket)
		}
	}
	slices.Sort(buckets)
	return buckets
}

// boundLoaded is a wait for the copy of a provider's bucket to be read
// once: revision 1 stands for "read".
type boundLoaded struct{ *mirror.BoundBucket }

func (b boundLoaded) Revision() uint64 {
	if b.Loaded() {
		return 1
	}
	return 0
}

func (b boundLoaded) WaitFor(ctx context.Context, _ uint64) bool { return b.WaitLoaded(ctx) }

// composeNeeds composes some of a node's needs, in key order.
func composeNeeds(sources compose.Sources, in *provisionerv1.ComposeRequest, needs []*mirror.Entry[*provisionerv1.NeedRecord], items []*provisionerv1.CollectRecord, revisions *provisionerv1.Revisions, arena *compose.Arena) *provisionerv1.ComposeResponse {
	input := compose.Input{Node: in.GetNode(), Module: in.GetModule(), Sources: sources, Items: items, Revisions: revisions, Arena: arena}
	input.Needs, input.Malformed = mirror.SplitNeeds(make([]*provisionerv1.NeedRecord, 0, len(needs)), nil, needs)
	return compose.Compose(input)
}

// merge appends a chunk's composition to a page's: a module's plan that the
// chunk continues is extended, not repeated.
func merge(out, part *provisionerv1.ComposeResponse) {
	plans := part.GetPlans()
	if n := len(out.GetPlans()); n > 0 && len(plans) > 0 && out.GetPlans()[n-1].GetModule() == plans[0].GetModule() {
		last := out.GetPlans()[n-1]
		items := last.GetItems()
		// A fresh array: the chunk's items are a window on one shared array.
		last.Items = append(items[:len(items):len(items)], plans[0].GetItems()...)
		plans = plans[1:]
	}
	out.Plans = append(out.Plans, plans...)
	out.Provisions = append(out.Provisions, part.GetProvisions()...)
	out.Refusals = append(out.Refusals, part.GetRefusals()...)
}

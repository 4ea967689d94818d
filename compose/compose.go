package compose

import (
	"cmp"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/durationpb"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/keyshape"
)

// Sources are what a composition reads beyond a node's own needs and items:
// the registry, the nodes' builds, the providers' entries and manifests.
// A nil function reads nothing: no builds, nothing bound, no manifests.
type Sources struct {
	// Registry returns the registry entry that answers kind, or nil. An
	// entry returned is never changed: another entry is another message
	// (an Arena and a PlanDigester keep what they made of each).
	Registry func(kind string) *provisionerv1.RegistryEntry
	// Builds returns the wanted and newest builds of a module on a node,
	// from its applied record; empty when it names none.
	Builds func(node, module string) (wanted, newest string)
	// Bound returns the revision of key in a provider's bucket: zero while
	// the provider has not bound it. key may be made in an Arena's (or a
	// PlanDigester's) array: keep a copy (strings.Clone), not key, past
	// the call.
	Bound func(bucket, key string) uint64
	// Manifest returns a provider's manifest, or nil when it has none.
	Manifest func(provider string) *provisionerv1.ManifestRecord
}

// Input is what a composition reads.
type Input struct {
	// Node is the node composed; Module, if set, the only module composed.
	Node, Module string
	Sources
	// Needs are the node's needs in key order.
	Needs []*provisionerv1.NeedRecord
	// Malformed are the node's need keys that are out of shape, in key order.
	Malformed []*provisionerv1.MalformedKey
	// Items are the node's collection items in key order.
	Items []*provisionerv1.CollectRecord
	// Arena is where the composition's plan items, collected items and
	// their keys' strings are made; nil, a new one.
	Arena *Arena
	// Revisions are those of the copy the input was read from.
	Revisions *provisionerv1.Revisions
}

// resolved is a registry entry made ready: once per composition, or once
// while the source returns the same entry (resolvedCache).
type resolved struct {
	entry *provisionerv1.RegistryEntry
	shape keyshape.Shape
	err   error // the entry's key shape does not parse
	// perProvider says the bucket is templated on the provider; buckets
	// holds the bucket of each provider met so far.
	perProvider bool
	buckets     map[string]string
}

// newResolved makes entry ready: its key shape parsed.
func newResolved(entry *provisionerv1.RegistryEntry) *resolved {
	r := &resolved{entry: entry}
	if b := entry.GetBucket(); b != nil {
		r.shape, r.err = keyshape.Parse(b.GetKeyShape())
		r.perProvider = strings.Contains(b.GetBucket(), "<provider>")
		r.buckets = map[string]string{}
		if r.err == nil && r.perProvider && !r.shape.LeadsWith("node") {
			// Answers are reused until a key of the node's own
			// changes in a provider's bucket: one by node first.
			r.err = fmt.Errorf("key shape %s of a bucket each provider keeps does not begin with <node>", r.shape)
		}
	}
	return r
}

// bucketOf returns the bucket of a provider, the template filled once for
// each of the first maxProviderBuckets providers met: a need names any
// provider it likes, and an entry is kept from one composition to the
// next (resolvedCache).
func (r *resolved) bucketOf(provider string) string {
	b, ok := r.buckets[provider]
	if !ok {
		b = strings.ReplaceAll(r.entry.GetBucket().GetBucket(), "<provider>", provider)
		if len(r.buckets) < maxProviderBuckets {
			r.buckets[strings.Clone(provider)] = b // provider may be a window on a need's value
		}
	}
	return b
}

// maxProviderBuckets bounds the providers' buckets an entry keeps.
const maxProviderBuckets = 256

// A resolvedCache keeps registry entries made ready from one composition to
// the next, for as long as the source's entry of their kind is the same
// message: a need written composes one module of its node, and making each
// of its kinds' entries ready again was a third of it.
type resolvedCache struct{ byKind map[string]*resolved }

// of returns entry, the source's entry of kind, made ready: the one kept
// if it is of the same message. A nil cache keeps nothing.
func (c *resolvedCache) of(kind string, entry *provisionerv1.RegistryEntry) *resolved {
	if c == nil {
		return newResolved(entry)
	}
	if r, ok := c.byKind[kind]; ok && r.entry == entry {
		return r
	}
	r := newResolved(entry)
	if c.byKind == nil {
		c.byKind = map[string]*resolved{}
	}
	c.byKind[strings.Clone(kind)] = r // kind may be a window on a need's value
	return r
}

// resolver makes each registry entry ready once per composition (or
// takes it from made), and reads each module's builds once.
type resolver struct {
	Sources
	kinds map[string]*resolved
	// Needs come in key order, so runs of one kind are common: the last kind
	// resolved is kept at hand.
	lastKind string
	last     *resolved
	// The builds of the last module met, for the same reason.
	lastModule builds
	// key is where each need's key is rendered, read before the next, and
	// text where the string of it is made, when it is made: an arena's,
	// or nil for strings of their own.
	key  []byte
	text *texts
	// collection is where each need's collection is rendered.
	collection []byte
	// made keeps the entries made ready past the composition, if not nil.
	made *resolvedCache
}

// builds are a module's builds on a node: wanted, then newest, once each
// (none when its applied record names none).
type builds struct {
	node, module string
	list         []string
	wanted       string
	newest       string
}

func newResolver(sources Sources) *resolver {
	return &resolver{Sources: sources, kinds: map[string]*resolved{}}
}

// buildsOf returns the builds of module on node.
func (rs *resolver) buildsOf(node, module string) *builds {
	b := &rs.lastModule
	if b.list != nil && b.node == node && b.module == module || rs.Builds == nil {
		return b
	}
	wanted, newest := rs.Builds(node, module)
	wanted, newest = cmp.Or(wanted, newest), cmp.Or(newest, wanted)
	*b = builds{node: node, module: module, wanted: wanted, newest: newest, list: []string{}}
	switch wanted {
	case "":
	case newest:
		b.list = []string{wanted}
	default:
		b.list = []string{wanted, newest}
	}
	return b
}

// of returns the module's builds whose plan holds need, and whether any
// does: a need that names no build belongs to every build, and every need
// belongs to a module that names none.
func (b *builds) of(need *provisionerv1.Need) ([]string, bool) {
	if len(b.list) == 0 {
		return nil, true
	}
	named := need.GetBuilds()
	if len(named) == 0 {
		return b.list, true
	}
	// Windows on the module's list, shared by its items: no allocation a
	// need.
	wanted := slices.Contains(named, b.list[0])
	newest := len(b.list) > 1 && slices.Contains(named, b.list[1])
	switch {
	case wanted && newest:
		return b.list, true
	case wanted:
		return b.list[:1:1], true
	case newest:
		return b.list[1:2:2], true
	}
	return nil, false
}

// resolve returns the entry that answers kind, made ready, or nil.
func (rs *resolver) resolve(kind string) *resolved {
	if kind == rs.lastKind && rs.last != nil {
		return rs.last
	}
	r, ok := rs.kinds[kind]
	if !ok {
		if entry := rs.Registry(kind); entry != nil {
			r = rs.made.of(kind, entry)
		}
		rs.kinds[kind] = r
	}
	rs.lastKind, rs.last = kind, r
	return r
}

// ProvisionsOf finds what one provider must provision, need by need, across
// nodes: each need is resolved as Compose resolves it, so that a provision
// found here is the one the need's node's composition holds. Each registry
// entry is made ready once, however many needs it answers.
type ProvisionsOf struct {
	provider string
	resolver *resolver
}

// NewProvisionsOf returns a finder of provider's provisions in sources.
func NewProvisionsOf(provider string, sources Sources) *ProvisionsOf {
	return &ProvisionsOf{provider: provider, resolver: newResolver(sources)}
}

// Need returns what need asks of the provider, with the need's node, or nil
// if it asks nothing of it (or its composition refuses it).
func (p *ProvisionsOf) Need(need *provisionerv1.NeedRecord) *provisionerv1.Provision {
	r := p.resolver.resolve(need.GetKind())
	if r == nil || !r.perProvider || need.GetNeed().GetProvider() != p.provider {
		return nil // not a need of this provider
	}
	builds, in := p.resolver.buildsOf(need.GetNode(), need.GetModule()).of(need.GetNeed())
	if !in {
		return nil
	}
	res, refusal := p.resolver.resolveNeed(need.GetNode(), need, r, builds)
	if refusal != nil || !res.provided {
		return nil
	}
	provision := res.fillProvision(&provisionerv1.Provision{}, need, builds)
	provision.Node = need.GetNode()
	return provision
}

// Compose resolves every need of in.Node (or of in.Module on it). It appends
// the phases it timed, "resolve" and "items", to the answer's phases.
func Compose(in Input) *provisionerv1.ComposeResponse {
	return NewComposer(in).Part(in.Needs, in.Malformed)
}

// A Composer composes a node's needs a part at a time, each part a
// composition of its own, with what its parts share read once: the
// registry entries made ready, the modules' builds, the node's collection
// items. A composition kept in parts, one a module, is composed again only
// where its needs changed. A Composer is for one goroutine at a time.
type Composer struct {
	in    Input
	rs    *resolver
	arena *Arena
	// byCollection lists each collection's items, made once the first
	// need that reads a collection is met.
	byCollection map[string][]*provisionerv1.CollectedItem
}

// NewComposer returns a Composer of in's node (and module), from in's
// sources, items and arena. in's needs and malformed keys are unread: each
// part names its own.
func NewComposer(in Input) *Composer {
	arena := in.Arena
	if arena == nil {
		arena = new(Arena)
	}
	rs := newResolver(in.Sources)
	rs.text, rs.made = &arena.text, &arena.resolved
	return &Composer{in: in, rs: rs, arena: arena}
}

// Part composes needs and malformed keys of the Composer's node, each in
// key order, as Compose composes an Input that holds only them. Parts of
// one Composer whose needs follow one another in key order are the parts
// of the composition of all their needs: its plans, provisions and
// refusals are the parts' one after the other, but that a module's plan
// continued by the next part is in both.
func (c *Composer) Part(needs []*provisionerv1.NeedRecord, malformed []*provisionerv1.MalformedKey) *provisionerv1.ComposeResponse {
	start := time.Now()
	in := c.in
	out := &provisionerv1.ComposeResponse{Node: in.Node, Module: in.Module, Revisions: in.Revisions}
	c.arena.reserve(len(needs))
	// Needs come in key order, so a module's items are contiguous: each
	// plan's items are a window on one backing array.
	p := &partSink{out: out, arena: c.arena, items: make([]*provisionerv1.PlanItem, 0, len(needs))}
	c.rs.walk(&in, needs, p)
	out.Refusals = refuseMalformed(out.GetRefusals(), malformed, in.Module)
	mark := time.Now()
	out.Phases = append(out.Phases, phase("resolve", mark.Sub(start)))

	if len(p.collections) > 0 {
		if c.byCollection == nil {
			c.byCollection = collectedBy(in.Items, c.arena)
		}
		for _, item := range p.collections {
			item.Items = c.byCollection[item.GetCollection()]
		}
	}
	out.Phases = append(out.Phases, phase("items", time.Since(mark)))
	return out
}

// collectedBy returns the items of each collection, made in arena. Items in
// key order hold each collection's together: its list is a window on one
// array of them all, and only a collection met again after another (items
// out of order) gets an array of its own.
func collectedBy(items []*provisionerv1.CollectRecord, arena *Arena) map[string][]*provisionerv1.CollectedItem {
	arena.reserveCollected(len(items))
	all := make([]*provisionerv1.CollectedItem, len(items))
	for i, it := range items {
		all[i] = arena.collected(it)
	}
	by := map[string][]*provisionerv1.CollectedItem{}
	for start := 0; start < len(items); {
		collection := items[start].GetCollection()
		end := start + 1
		for end < len(items) && items[end].GetCollection() == collection {
			end++
		}
		if list, ok := by[collection]; ok {
			by[collection] = append(list[:len(list):len(list)], all[start:end]...)
		} else {
			by[collection] = all[start:end:end]
		}
		start = end
	}
	return by
}

// partSink makes the messages of a Part as walk composes it.
type partSink struct {
	out       *provisionerv1.ComposeResponse
	arena     *Arena
	items     []*provisionerv1.PlanItem
	plans     *provisionerv1.ModulePlan // the plan being made
	planStart int
	// collections are the items that read a collection, filled once the
	// walk is done.
	collections []*provisionerv1.PlanItem
}

func (p *partSink) plan(module string, b *builds) {
	p.plans = p.arena.plan()
	p.plans.Module, p.plans.WantedBuild, p.plans.NewestBuild = module, b.wanted, b.newest
	p.out.Plans = append(p.out.Plans, p.plans)
	p.planStart = len(p.items)
}

func (p *partSink) item(need *provisionerv1.NeedRecord, res resolution, builds []string) string {
	item := res.item(need, builds, p.arena)
	if item.GetCollection() != "" {
		p.collections = append(p.collections, item)
	}
	p.items = append(p.items, item)
	p.plans.Items = p.items[p.planStart:len(p.items):len(p.items)]
	return res.keyString
}

func (p *partSink) provision(need *provisionerv1.NeedRecord, res resolution, builds []string) {
	p.out.Provisions = append(p.out.Provisions, res.fillProvision(p.arena.provision(), need, builds))
}

func (p *partSink) refusal(r *provisionerv1.Refusal) { p.out.Refusals = append(p.out.Refusals, r) }

func phase(name string, d time.Duration) *provisionerv1.Phase {
	return &provisionerv1.Phase{Name: name, Duration: durationpb.New(d)}
}

// refuseMalformed appends the refusals of malformed need keys (of module,
// if set) to refusals, and orders them all by key, as a composition lists
// them.
func refuseMalformed(refusals []*provisionerv1.Refusal, malformed []*provisionerv1.MalformedKey, module string) []*provisionerv1.Refusal {
	for _, m := range malformed {
		tokens := strings.Split(m.GetKey(), ".")
		if module != "" && len(tokens) > 1 && tokens[1] != module {
			continue
		}
		r := &provisionerv1.Refusal{Key: m.GetKey(), Reason: provisionerv1.RefusalReason_REFUSAL_REASON_MALFORMED_NEED, Detail: m.GetReason()}
		for i, field := range []*string{&r.Module, &r.Kind, &r.Name} {
			if i+1 < len(tokens) {
				*field = tokens[i+1]
			}
		}
		if name, err := keys.Unescape(r.GetName()); err == nil {
			r.Name = name // readable, as in plan items, where the token allows
		}
		refusals = append(refusals, r)
	}
	slices.SortFunc(refusals, func(a, b *provisionerv1.Refusal) int { return cmp.Compare(a.GetKey(), b.GetKey()) })
	return refusals
}

// A resolution is what a need resolved to, before any message is made of
// it: its plan item's owner and location, and, for an entry each provider
// answers, what it asks of the provider. Part makes messages of it, and
// PlanDigester.Digest appends it to a digest, which makes none.
type resolution struct {
	owner string
	// verb is the entry's verb, when the item's value is read by calling
	// it; else the value is at key in bucket.
	verb   *provisionerv1.VerbSource
	bucket string
	// key is rendered in the resolver's buffer: read it before the next
	// need is resolved. keyString is it as a string, once made in text.
	key        []byte
	keyString  string
	text       *texts
	collection string
	// provided says the need asks provider for a provision: the entry is
	// answered by each provider.
	provided       bool
	provider       string
	provision      string
	bound          uint64
	manifestDigest string
}

// keyOf returns the key as a string, made once.
func (res *resolution) keyOf() string {
	if res.keyString == "" {
		res.keyString = res.text.string(res.key)
	}
	return res.keyString
}

// item returns the plan item of a need resolved, made in arena.
func (res *resolution) item(need *provisionerv1.NeedRecord, builds []string, arena *Arena) *provisionerv1.PlanItem {
	item := arena.item()
	item.Kind, item.Name, item.Placeholder = need.GetKind(), need.GetName(), need.GetNeed().GetPlaceholder()
	item.Owner, item.Revision, item.Builds, item.Collection = res.owner, need.GetRevision(), builds, res.collection
	if res.verb != nil {
		item.Location = arena.verb(res.verb)
	} else {
		item.Location = arena.bucketKey(res.bucket, res.keyOf())
	}
	return item
}

// fillProvision fills p, a provision with no node, with what a need
// resolved asks of its provider, and returns it.
func (res *resolution) fillProvision(p *provisionerv1.Provision, need *provisionerv1.NeedRecord, builds []string) *provisionerv1.Provision {
	p.Provider, p.Bucket, p.Key = res.provider, res.bucket, res.keyOf()
	p.Module, p.Provision, p.Local, p.Name = need.GetModule(), res.provision, need.GetNeed().GetLocal(), need.GetName()
	p.Builds, p.BoundRevision, p.ManifestDigest = builds, res.bound, res.manifestDigest
	return p
}

// collectionOf returns keyshape.CollectionOf(template, kind, name), made
// in the resolver's text: a collection that is the name is the name.
func (rs *resolver) collectionOf(template, kind, name string) string {
	rs.collection = keyshape.AppendCollection(rs.collection[:0], template, kind, name)
	if string(rs.collection) == name {
		return name
	}
	return rs.text.string(rs.collection)
}

// resolveNeed resolves one need of the builds given: what its plan item is
// made of (and its provision, for an entry that each provider answers), or
// a refusal.
func (rs *resolver) resolveNeed(node string, need *provisionerv1.NeedRecord, r *resolved, builds []string) (resolution, *provisionerv1.Refusal) {
	refuse := func(reason provisionerv1.RefusalReason, format string, args ...any) (resolution, *provisionerv1.Refusal) {
		key, _ := keys.NeedKey{Node: node, Module: need.GetModule(), Kind: need.GetKind(), Name: need.GetName()}.Key()
		return resolution{}, &provisionerv1.Refusal{
			Key: key, Module: need.GetModule(), Kind: need.GetKind(), Name: need.GetName(),
			Reason: reason, Detail: fmt.Sprintf(format, args...), Builds: builds,
		}
	}
	if r == nil {
		return refuse(provisionerv1.RefusalReason_REFUSAL_REASON_NO_DOMAIN, "no registry entry answers kind %q", need.GetKind())
	}
	res := resolution{owner: r.entry.GetOwner()}
	if verb := r.entry.GetVerb(); verb != nil {
		res.verb = verb
		return res, nil
	}
	if r.err != nil {
		return refuse(provisionerv1.RefusalReason_REFUSAL_REASON_UNFILLABLE_KEY_SHAPE, "the registry entry of kind %q is unusable: %v", need.GetKind(), r.err)
	}
	source := r.entry.GetBucket()
	provider := need.GetNeed().GetProvider()
	res.bucket = source.GetBucket()
	if r.perProvider {
		if err := keys.CheckToken(provider); err != nil {
			return refuse(provisionerv1.RefusalReason_REFUSAL_REASON_UNFILLABLE_KEY_SHAPE, "kind %q is answered by each provider in bucket %s, and the need's provider %q %v", need.GetKind(), res.bucket, provider, err)
		}
		res.bucket = r.bucketOf(provider)
		if res.owner == keyshape.ProviderOwner {
			res.owner = provider
		}
	}
	provision := cmp.Or(need.GetNeed().GetProvision(), need.GetName())
	values := keyshape.Values{
		Node: node, Module: need.GetModule(), Kind: need.GetKind(), Name: need.GetName(),
		Provision: provision, Local: need.GetNeed().GetLocal(), Provider: provider,
	}
	var err error
	if tmpl := source.GetCollection(); tmpl != "" {
		res.collection = rs.collectionOf(tmpl, need.GetKind(), need.GetName())
		values.Collection = res.collection
		rs.key, err = r.shape.AppendFilter(rs.key[:0], values)
	} else {
		rs.key, err = r.shape.AppendRender(rs.key[:0], values)
	}
	if err != nil {
		return refuse(provisionerv1.RefusalReason_REFUSAL_REASON_UNFILLABLE_KEY_SHAPE, "%v", err)
	}
	res.key, res.text = rs.key, rs.text
	if !r.perProvider {
		return res, nil
	}
	res.provided, res.provider, res.provision = true, provider, provision
	key := res.keyOf()
	if rs.Bound != nil {
		res.bound = rs.Bound(res.bucket, key)
	}
	var manifest *provisionerv1.ManifestRecord
	if rs.Manifest != nil {
		manifest = rs.Manifest(provider)
	}
	switch {
	case manifest != nil && !offers(manifest.GetManifest(), provision):
		return refuse(provisionerv1.RefusalReason_REFUSAL_REASON_NOT_OFFERED, "provider %q does not offer provision %q: its manifest (%s) offers %s",
			provider, provision, manifest.GetDigest(), offered(manifest.GetManifest()))
	case manifest != nil:
		res.manifestDigest = manifest.GetDigest()
	case res.bound > 0:
		return refuse(provisionerv1.RefusalReason_REFUSAL_REASON_NO_MANIFEST, "provider %q bound key %s of %s (revision %d) but has declared no manifest: a node that runs it must write its manifest to %s",
			provider, key, res.bucket, res.bound, keys.ManifestsBucket)
	}
	return res, nil
}

// offers reports whether a manifest offers provision.
func offers(m *provisionerv1.Manifest, provision string) bool {
	return slices.ContainsFunc(m.GetOffers(), func(o *provisionerv1.Offer) bool { return o.GetProvision() == provision })
}

// offered lists what a manifest offers, for a sentence.
func offered(m *provisionerv1.Manifest) string {
	if len(m.GetOffers()) == 0 {
		return "nothing"
	}
	names := make([]string, len(m.GetOffers()))
	for i, o := range m.GetOffers() {
		names[i] = strconv.Quote(o.GetProvision())
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

package plans

import (
	"slices"
	"sync"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
)

// Plan is what the plans writer reads of a node's composition.
type Plan struct {
	Digest string
	// revisions are those the copies had reached after it was composed.
	Revisions *provisionerv1.Revisions
	// Buckets are the providers' buckets it read keys of, Kinds the
	// registry entries it read (answering or not), and Providers the
	// providers whose manifests it read, each sorted: what, changed, may
	// change it.
	Buckets, Kinds, Providers []string
	// Records is how many needs the node holds and collection items the
	// composition read: the node's size, which the writer's Share is of.
	Records int
}

// Compose returns the digest of node's whole composition in the copy m, the
// revisions the copies had reached after it was composed (of the
// providers' buckets, those it read), and what it read beside the node's
// own records: the providers' buckets, registry entries and manifests.
// It makes no composition (compose.PlanDigester): the digest is what the
// bucket holds, and a node notified asks for its composition, which is
// made then. Nor does it keep a decoded view of the node: the writer reads
// every node, each decoded in a scratch of the pool. The writer composes
// with ComposeChanged, which keeps what composes a node's next change
// module by module.
func Compose(m *mirror.Mirror, node string) Plan {
	plan, _ := ComposeChanged(m, node, nil)
	return plan
}

// composeWhole is Compose for a node whose needs the copy holds out of key
// order, which it never does: digested from its composition, keeping
// nothing.
func composeWhole(m *mirror.Mirror, node string) Plan {
	scratch := scratches.Get().(*digestScratch)
	defer scratches.Put(scratch)
	var r reads
	digest, records := planDigestOf(m, node, scratch, &r)
	buckets := r.buckets.sorted()
	// Read after composing: a node that asks at these revisions is
	// answered a composition at least as new as the digest.
	return Plan{Digest: digest, Revisions: m.RevisionsNow().Only(buckets).Proto(), Records: records,
		Buckets: buckets, Kinds: r.kinds.sorted(), Providers: r.providers.sorted()}
}

// reads are what a composition read beside the node's own records.
type reads struct {
	buckets, kinds, providers names
}

// names are names heard, each once, in the order heard: a composition
// reads few of each, so a slice is the cheapest set.
type names []string

func (n *names) add(name string) {
	if !slices.Contains(*n, name) {
		*n = append(*n, name)
	}
}

func (n names) sorted() []string {
	slices.Sort(n)
	return n
}

// digestScratch is where the plans writer digests a node (planDigestOf),
// reused from one node to the next: the arrays its needs and items are
// decoded in (mirror.Scratch), their lists, and a PlanDigester's buffers.
type digestScratch struct {
	needs     mirror.Scratch[*provisionerv1.NeedRecord]
	collect   mirror.Scratch[*provisionerv1.CollectRecord]
	records   []*provisionerv1.NeedRecord
	malformed []*provisionerv1.MalformedKey
	items     []*provisionerv1.CollectRecord
	marks     []moduleMark
	applied   []appliedRevision
	digester  compose.PlanDigester
}

// scratches are the plans writer's digestScratches, one a worker.
var scratches = sync.Pool{New: func() any { return new(digestScratch) }}

// planDigestOf returns the plan digest of node's whole composition, the
// one its compose answer carries, without making the composition
// (compose.PlanDigester), nor keeping the node's decoded views, and how
// many needs and collection items it read. r, if set, hears what else it
// reads: each providers' bucket it reads a key of, each registry entry and
// each provider's manifest.
func planDigestOf(m *mirror.Mirror, node string, scratch *digestScratch, r *reads) (digest string, read int) {
	entries, _, _ := m.Needs.GroupInto(node, &scratch.needs)
	items, _, _ := m.Collect.GroupInto(node, &scratch.collect)
	builds, _ := m.BuildsOf(node)
	sources := m.Sources(&builds)
	if r != nil {
		sources = r.hear(sources)
	}
	records, malformed := mirror.SplitNeeds(scratch.records[:0], scratch.malformed[:0], entries)
	in := compose.Input{Node: node, Sources: sources, Needs: records, Malformed: malformed, Items: mirror.WellFormed(scratch.items[:0], items)}
	digest = scratch.digester.Digest(in)
	// Kept for their room, not their records.
	scratch.records, scratch.malformed, scratch.items = emptied(in.Needs), emptied(in.Malformed), emptied(in.Items)
	return digest, len(entries) + len(items)
}

// hear returns sources that tell r each providers' bucket they read a key
// of, each registry entry and each provider's manifest they read.
func (r *reads) hear(sources compose.Sources) compose.Sources {
	key, entry, manifest := sources.Bound, sources.Registry, sources.Manifest
	sources.Bound = func(bucket, k string) uint64 {
		r.buckets.add(bucket)
		return key(bucket, k)
	}
	sources.Registry = func(kind string) *provisionerv1.RegistryEntry {
		r.kinds.add(kind)
		return entry(kind)
	}
	sources.Manifest = func(provider string) *provisionerv1.ManifestRecord {
		r.providers.add(provider)
		return manifest(provider)
	}
	return sources
}

// emptied returns s emptied, its elements zeroed.
func emptied[T any](s []T) []T {
	clear(s)
	return s[:0]
}

package mirror

import (
	"context"
	"slices"
	"strings"
	"sync/atomic"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/keyshape"
	"github.com/novox/mesh-provisioner/wire"
)

// Mirror is the watched copy of the five provisioning buckets, and of the
// keys of the providers' buckets (Bound).
type Mirror struct {
	Registry  *Copy[*provisionerv1.RegistryRecord]
	Needs     *Copy[*provisionerv1.NeedRecord]
	Applied   *Copy[*provisionerv1.AppliedRecord]
	Collect   *Copy[*provisionerv1.CollectRecord]
	Manifests *Copy[*provisionerv1.ManifestRecord]
	Bound     *Bound

	manifests *manifests
	moved     chan struct{}
	// held is the partitions whose nodes the partial copies hold
	// (SetHolds), nil for every node.
	held atomic.Pointer[[]bool]
}

// New returns an empty mirror.
func New() *Mirror {
	ms := &manifests{byDigest: map[string]*provisionerv1.Manifest{}}
	registry := NewCopy(keys.RegistryBucket, decodeRegistry)
	registry.views.limit = 0 // a few dozen kinds, read by every composition
	needs := newCopy(keys.NeedsBucket, decodeNeed, needRecords)
	needs.check = checkNeed
	collect := newCopy(keys.CollectBucket, decodeCollect, collectRecords)
	collect.check = checkCollect
	bound := NewBound()
	bound.isNode = func(first string) bool {
		st, _ := needs.Stamp(first)
		return st != 0
	}
	m := &Mirror{
		Registry:  registry,
		Needs:     needs,
		Applied:   NewCopy(keys.AppliedBucket, decodeApplied),
		Collect:   collect,
		Manifests: NewCopy(keys.ManifestsBucket, ms.decode),
		Bound:     bound,
		manifests: ms,
		moved:     make(chan struct{}, 1),
	}
	for _, c := range m.followedCopies() {
		c.setMoved(m.moved)
	}
	return m
}

// Moved receives once any of the five copies changed since it last
// received: one value for every change meanwhile. It has one reader (the
// plans' writer); a provider's bucket moving (Bound) is not sent.
func (m *Mirror) Moved() <-chan struct{} { return m.moved }

// Watched is what a reader asks of a bucket's copy, whatever its record:
// how far it is, whether it may lag, what it holds.
type Watched interface {
	Bucket() string
	Loaded() <-chan struct{}
	Ready() bool
	Behind() bool
	Revision() uint64
	Counts() (records, malformed, groups int, revision uint64)
	Stamp(first string) (stamp, revision uint64)
	Empty() bool
	WaitFor(ctx context.Context, revision uint64) bool
}

// followed is what a follower (and a capture's load) does to a bucket's
// copy: the changes it applies, and what it asks to resume or to read
// again.
type followed interface {
	Watched
	Apply(key string, value []byte, revision uint64, deleted bool)
	fillIn(key string, value []byte, revision uint64)
	MarkLoaded()
	setBehind(bool)
	setMoved(chan<- struct{})
	keepOnly(live map[string]bool, read func(first string) bool)
	advance(revision uint64)
	readmits() <-chan struct{}
	takeReadmits() []string
	notHeld(key string) (revision uint64, ok bool)
	liveKeys() (n int, oldest, revision uint64)
	holdsGroup(first string) bool
	setHolds(holds func(first string) bool)
	dropUnheld()
}

// Copies returns the five copies of the provisioning buckets, the registry
// first.
func (m *Mirror) Copies() []Watched {
	return []Watched{m.Registry, m.Needs, m.Applied, m.Collect, m.Manifests}
}

// followedCopies returns Copies as their followers see them.
func (m *Mirror) followedCopies() []followed {
	return []followed{m.Registry, m.Needs, m.Applied, m.Collect, m.Manifests}
}

// Ready reports whether every copy holds its bucket's initial values.
func (m *Mirror) Ready() bool {
	for _, c := range m.Copies() {
		if !c.Ready() {
			return false
		}
	}
	return true
}

// Loading returns the buckets whose initial values are not in yet.
func (m *Mirror) Loading() []string {
	var buckets []string
	for _, c := range m.Copies() {
		if !c.Ready() {
			buckets = append(buckets, c.Bucket())
		}
	}
	return buckets
}

// Behind returns the provisioning buckets whose copy is known to lag the
// bucket (Bound.Behind says it of the providers' buckets).
func (m *Mirror) Behind() []string {
	var buckets []string
	for _, c := range m.Copies() {
		if c.Behind() {
			buckets = append(buckets, c.Bucket())
		}
	}
	return buckets
}

// SetHolds has the copies of needs, applied records and items hold the
// keys of the nodes of the partitions held, held[p] for each partition p of
// a mesh of len(held) (wire.PartitionOf), and no other: a key of another
// node moves its copy's revision, and is dropped. An instance that serves
// some partitions of the mesh holds their nodes alone, and reads their
// keys alone where the buckets store keys by partition (wire.StoredKeys);
// the registry, the manifests and the providers' buckets stay whole. Call
// it before the mirror is loaded.
func (m *Mirror) SetHolds(held []bool) {
	m.setHeld(held)
	for _, c := range m.partial() {
		c.setHolds(holdsOf(held))
	}
}

// setHeld records the partitions the partial copies hold.
func (m *Mirror) setHeld(held []bool) {
	held = slices.Clone(held)
	m.held.Store(&held)
}

// heldNow returns the partitions the partial copies hold, nil for every
// node.
func (m *Mirror) heldNow() []bool {
	if held := m.held.Load(); held != nil {
		return *held
	}
	return nil
}

// holdsOf returns whether a node is of a partition held.
func holdsOf(held []bool) func(node string) bool {
	return func(node string) bool { return held[wire.PartitionOf(node, len(held))] }
}

// partial returns the copies that may hold some nodes only (SetHolds).
func (m *Mirror) partial() []followed { return []followed{m.Needs, m.Applied, m.Collect} }

// SetBudget bounds what the copy holds of each node in each state bucket;
// onChange hears when a node goes over its budget in a bucket or comes back
// under. Call it before the mirror is loaded.
func (m *Mirror) SetBudget(b Budget, onChange func(Excess)) {
	m.Needs.SetBudget(b, onChange)
	m.Applied.SetBudget(b, onChange)
	m.Collect.SetBudget(b, onChange)
	m.Manifests.SetBudget(b, onChange)
}

// OverBudget returns the nodes over their budget, bucket by bucket.
func (m *Mirror) OverBudget() []Excess {
	return append(slices.Concat(m.Needs.OverBudget(), m.Applied.OverBudget(), m.Collect.OverBudget(), m.Manifests.OverBudget()), []Excess{}...)
}

// RegistryEntry returns the entry that answers kind, or nil.
func (m *Mirror) RegistryEntry(kind string) *provisionerv1.RegistryEntry {
	r, ok := m.Registry.Get(kind, kind)
	if !ok {
		return nil
	}
	return r.GetEntry()
}

// BoundBucketOf returns the bucket in which provider answers needs of kind,
// if the registry's entry of kind is answered by each provider.
func (m *Mirror) BoundBucketOf(kind, provider string) (string, bool) {
	template := m.RegistryEntry(kind).GetBucket().GetBucket()
	if !strings.Contains(template, keyshape.ProviderOwner) || keys.CheckToken(provider) != nil {
		return "", false
	}
	return strings.ReplaceAll(template, keyshape.ProviderOwner, provider), true
}

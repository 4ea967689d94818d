package mirror

import (
	"sync"
	"sync/atomic"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// manifests decodes each manifest once by its digest, however many nodes
// declare it, and finds a provider's manifest for compositions.
type manifests struct {
	mu       sync.Mutex
	byDigest map[string]*provisionerv1.Manifest
	decodes  atomic.Uint64

	// index is each provider's newest manifest, built from the copy once
	// per change of it (gen).
	index atomic.Pointer[manifestIndex]
}

type manifestIndex struct {
	gen        uint64
	byProvider map[string]*provisionerv1.ManifestRecord
}

// decode is the manifests copy's decoder.
func (ms *manifests) decode(key string, value []byte, revision uint64) (*provisionerv1.ManifestRecord, error) {
	k, err := keys.ParseManifestKey(key)
	if err != nil {
		return nil, err
	}
	digest := wire.ManifestDigest(value)
	ms.mu.Lock()
	defer ms.mu.Unlock()
	manifest, ok := ms.byDigest[digest]
	if !ok {
		manifest = &provisionerv1.Manifest{}
		if err := decodeValue(value, manifest); err != nil {
			return nil, err
		}
		ms.decodes.Add(1)
		ms.byDigest[digest] = manifest
	}
	return &provisionerv1.ManifestRecord{Node: k.Node, Provider: k.Provider, Manifest: manifest, Digest: digest, Revision: revision}, nil
}

// ManifestDecodes returns how many manifests the mirror has decoded: one a
// digest, however many keys hold it and compositions read it.
func (m *Mirror) ManifestDecodes() uint64 { return m.manifests.decodes.Load() }

// ManifestOf returns the manifest of provider: the one written last by any
// node that runs it, or nil when none declares one.
func (m *Mirror) ManifestOf(provider string) *provisionerv1.ManifestRecord {
	return m.manifestIndex().byProvider[provider]
}

// ManifestRevisions returns the revision of each provider's manifest as
// ManifestOf returns it, from the same index: read once a change of the
// manifests, however many ask.
func (m *Mirror) ManifestRevisions() map[string]uint64 {
	byProvider := m.manifestIndex().byProvider
	revisions := make(map[string]uint64, len(byProvider))
	for provider, r := range byProvider {
		revisions[provider] = r.GetRevision()
	}
	return revisions
}

// manifestIndex returns each provider's newest manifest, made again once
// the manifests' copy changed.
func (m *Mirror) manifestIndex() *manifestIndex {
	gen, _ := m.Manifests.Stamp("")
	idx := m.manifests.index.Load()
	if idx == nil || idx.gen != gen {
		idx = &manifestIndex{gen: gen, byProvider: map[string]*provisionerv1.ManifestRecord{}}
		all, _ := m.Manifests.All()
		for _, e := range all {
			if e.Malformed != nil {
				continue
			}
			r := e.Record
			if have := idx.byProvider[r.GetProvider()]; have == nil || have.GetRevision() < r.GetRevision() {
				idx.byProvider[r.GetProvider()] = r
			}
		}
		m.manifests.index.Store(idx)
	}
	return idx
}

package mirror

import provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"

// Revisions are the revisions the copies had reached, and the stamp of the
// providers' buckets' copy, whose revisions it identifies. An answer names
// them, and so does a plan digest: a node that asks at them is answered a
// composition at least as new.
type Revisions struct {
	Registry, Needs, Applied, Collect, Manifests uint64
	// BoundStamp identifies the providers' buckets' revisions, Bound.
	BoundStamp uint64
	Bound      map[string]uint64
}

// RevisionsNow returns the revisions the copies have reached.
func (m *Mirror) RevisionsNow() Revisions {
	// The stamp first: the revisions read after it are at least as new.
	boundStamp := m.Bound.Stamp()
	return Revisions{
		Registry: m.Registry.Revision(), Needs: m.Needs.Revision(), Applied: m.Applied.Revision(),
		Collect: m.Collect.Revision(), Manifests: m.Manifests.Revision(),
		BoundStamp: boundStamp, Bound: m.Bound.Revisions(),
	}
}

// Same reports whether two sets of revisions are equal.
func (r Revisions) Same(o Revisions) bool {
	return r.Registry == o.Registry && r.Needs == o.Needs && r.Applied == o.Applied &&
		r.Collect == o.Collect && r.Manifests == o.Manifests && r.BoundStamp == o.BoundStamp
}

// Only returns the revisions with those of the providers' buckets named
// alone: an answer names the buckets its asker reads, no other provider.
func (r Revisions) Only(buckets []string) Revisions {
	bound := r.Bound
	r.Bound = nil
	for _, b := range buckets {
		if rev, ok := bound[b]; ok {
			if r.Bound == nil {
				r.Bound = map[string]uint64{}
			}
			r.Bound[b] = rev
		}
	}
	return r
}

// Proto returns the revisions as an answer carries them.
func (r Revisions) Proto() *provisionerv1.Revisions {
	return &provisionerv1.Revisions{Registry: r.Registry, Needs: r.Needs, Applied: r.Applied,
		Collect: r.Collect, Manifests: r.Manifests, Bound: r.Bound}
}

package mirror

import (
	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// What a composition reads of the copy, for compose, whichever way it is
// made: a compose answer (whole, a page, or a module's section at a time)
// and the plans writer's digest read a node's needs and items from their
// copies and everything else through Sources.

// Sources returns what compositions read of the copy beyond a node's own
// needs and items. The builds are builds, the node's read with its needs
// (BuildsOf), or, when nil, each module's as the copy holds it when it is
// read (moduleBuilds: in place, keeping no decoded view of the node).
func (m *Mirror) Sources(builds *Builds) compose.Sources {
	read := m.moduleBuilds
	if builds != nil {
		read = func(_, module string) (string, string) { return builds.Of(module) }
	}
	return compose.Sources{Registry: m.RegistryEntry, Builds: read, Bound: m.Bound.Key, Manifest: m.ManifestOf}
}

// SplitNeeds appends needs' records to records, and the keys of those
// malformed to malformed, as compose.Input holds them.
func SplitNeeds(records []*provisionerv1.NeedRecord, malformed []*provisionerv1.MalformedKey, needs []*Entry[*provisionerv1.NeedRecord]) ([]*provisionerv1.NeedRecord, []*provisionerv1.MalformedKey) {
	for _, e := range needs {
		if e.Malformed != nil {
			malformed = append(malformed, e.Malformed)
		} else {
			records = append(records, e.Record)
		}
	}
	return records, malformed
}

// WellFormed appends the records of items that are not malformed to
// records: a composition reads no malformed item.
func WellFormed(records []*provisionerv1.CollectRecord, items []*Entry[*provisionerv1.CollectRecord]) []*provisionerv1.CollectRecord {
	for _, e := range items {
		if e.Malformed == nil {
			records = append(records, e.Record)
		}
	}
	return records
}

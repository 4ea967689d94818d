// Package meshchange makes the change the benches time a mesh's plans
// by: a registry entry that most nodes' compositions read, changed so that
// each of theirs changes.
package meshchange

import (
	"context"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/registry"
)

// WidestKind returns the registry's bucket kind the most nodes' needs
// read, and which nodes read it: only their compositions change with it.
func WidestKind(mesh *synth.Mesh) (string, []bool) {
	bucketKinds := map[string]bool{}
	for _, e := range registry.Table() {
		if e.GetBucket() != nil && e.GetBucket().GetCollection() == "" {
			bucketKinds[e.GetKind()] = true
		}
	}
	count := map[string]int{}
	for _, n := range mesh.Nodes {
		seen := map[string]bool{}
		for _, need := range n.Needs {
			if bucketKinds[need.Kind] && !seen[need.Kind] {
				seen[need.Kind] = true
				count[need.Kind]++
			}
		}
	}
	best := ""
	for k, c := range count {
		if best == "" || c > count[best] || c == count[best] && k < best {
			best = k
		}
	}
	readers := make([]bool, len(mesh.Nodes))
	for i, n := range mesh.Nodes {
		readers[i] = slices.ContainsFunc(n.Needs, func(need synth.Need) bool { return need.Kind == best })
	}
	return best, readers
}

// ChangeKind returns kind's registry entry, as the bucket holds it, with
// its bucket renamed: every composition that reads it changes.
func ChangeKind(ctx context.Context, kv jetstream.KeyValue, kind string) ([]byte, error) {
	e, err := kv.Get(ctx, kind)
	if err != nil {
		return nil, err
	}
	entry := &provisionerv1.RegistryEntry{}
	if err := proto.Unmarshal(e.Value(), entry); err != nil {
		return nil, err
	}
	if entry.GetBucket() == nil {
		return nil, fmt.Errorf("registry kind %s has no bucket", kind)
	}
	entry.GetBucket().Bucket += "-bench"
	return proto.MarshalOptions{Deterministic: true}.Marshal(entry)
}

package answers

import (
	"testing"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/registry"
)

// A manifest is decoded once per digest, however many nodes declare it and
// compositions read it: here 1,000 nodes each declare pg's manifest (one
// digest), the first node declares the other providers' too (three more),
// and every node is composed.
func TestAManifestIsDecodedOncePerDigest(t *testing.T) {
	t.Parallel()
	mesh := synth.Generate(synth.Config{Nodes: 1000, Modules: 3, Needs: 8, Seed: 7, Bound: 50})
	pg := mesh.Nodes[0].Manifests[0]
	for i := range mesh.Nodes[1:] {
		node := &mesh.Nodes[i+1]
		node.Manifests = append(node.Manifests, synth.Manifest{Provider: pg.Provider, Manifest: proto.Clone(pg.Manifest).(*provisionerv1.Manifest)})
	}
	capture, err := mesh.Capture(registry.Table())
	if err != nil {
		t.Fatal(err)
	}
	m, err := mirror.Load(capture)
	if err != nil {
		t.Fatal(err)
	}
	if records, _, _, _ := m.Manifests.Counts(); records != 1000+3 {
		t.Fatalf("the copy holds %d manifests, want 1,003", records)
	}
	var provisions, offered int
	for _, node := range mesh.Nodes {
		out, _, werr := composeFrom(m, &provisionerv1.ComposeRequest{Node: node.Name}, Encoding{}, unpaged, reading{views: keepViews})
		if werr != nil {
			t.Fatal(werr)
		}
		provisions += len(out.GetProvisions())
		for _, p := range out.GetProvisions() {
			if p.GetManifestDigest() != "" {
				offered++
			}
		}
	}
	if provisions == 0 || offered != provisions {
		t.Errorf("%d provisions, %d with a manifest's digest; want every one", provisions, offered)
	}
	if got := m.ManifestDecodes(); got != 4 {
		t.Errorf("%d manifests decoded for 4 digests over %d compositions", got, len(mesh.Nodes))
	}
}

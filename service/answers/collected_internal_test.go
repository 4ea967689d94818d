package answers

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/registry"
)

// marshalCompose and sizeCompose say what proto.Marshal and proto.Size
// say, and leave the composition as it was.
func TestMarshalComposeDecodesAsProtoMarshal(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		answer func(t *testing.T) *provisionerv1.ComposeResponse
	}{
		{"empty", func(*testing.T) *provisionerv1.ComposeResponse { return &provisionerv1.ComposeResponse{} }},
		{"no collected items", func(*testing.T) *provisionerv1.ComposeResponse {
			return &provisionerv1.ComposeResponse{Node: "n", PlanDigest: "sha256:00", Plans: []*provisionerv1.ModulePlan{
				{Module: "web", Items: []*provisionerv1.PlanItem{{Kind: "port", Name: "http", Revision: 3}}},
				{Module: "db"},
			}}
		}},
		{"one list in two items", func(*testing.T) *provisionerv1.ComposeResponse { return sharedCollected("export A=1") }},
		{"a synthetic node", func(t *testing.T) *provisionerv1.ComposeResponse {
			return composedSynth(t, synth.Config{Nodes: 1, Modules: 30, Needs: 10})
		}},
		{"a synthetic node between builds, bound", func(t *testing.T) *provisionerv1.ComposeResponse {
			return composedSynth(t, synth.Config{Nodes: 1, Modules: 15, Needs: 25, Builds: 50, Bound: 50, Seed: 7})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			answer := tt.answer(t)
			before := proto.Clone(answer)
			data, err := marshalCompose(answer)
			if err != nil {
				t.Fatal(err)
			}
			got := &provisionerv1.ComposeResponse{}
			if err := proto.Unmarshal(data, got); err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(before, got, protocmp.Transform()); diff != "" {
				t.Errorf("marshalCompose decodes otherwise (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(before, answer, protocmp.Transform()); diff != "" {
				t.Errorf("marshalCompose changed the composition (-was +is):\n%s", diff)
			}
			if want, size := proto.Size(before), sizeCompose(answer); size != want || len(data) != want {
				t.Errorf("sizeCompose says %d and marshalCompose wrote %d bytes; proto.Size says %d", size, len(data), want)
			}
		})
	}
}

// composedSynth composes the first node of a synthetic mesh.
func composedSynth(t testing.TB, cfg synth.Config) *provisionerv1.ComposeResponse {
	t.Helper()
	capture, err := synth.Generate(cfg).Capture(registry.Table())
	if err != nil {
		t.Fatal(err)
	}
	replay, err := NewReplay(capture)
	if err != nil {
		t.Fatal(err)
	}
	answer, err := replay.Compose(&provisionerv1.ComposeRequest{Node: nodesOf(capture)[0]})
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

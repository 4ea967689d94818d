package service

import (
	"testing"

	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/service/plans"
)

// BenchmarkComposeForPlans is the writer's cost a node: a 1,000 x 30 x 10
// mesh, each node composed for its digest as RunPlans does.
func BenchmarkComposeForPlans(b *testing.B) {
	s, mesh, _ := startOnMesh(b, synth.Config{Nodes: 1000, Modules: 30, Needs: 10}, Config{NoAnswerCache: true})
	b.ResetTimer()
	i := 0
	for b.Loop() {
		plans.Compose(s.mirror, mesh.Nodes[i%len(mesh.Nodes)].Name)
		i++
	}
}

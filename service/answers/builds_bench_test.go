package answers

import (
	"fmt"
	"testing"
	"time"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/registry"
)

// BenchmarkComposeBuilds composes the same 4 nodes of 60 modules x 25 needs
// at one build (no module names a build) and at two (every module between
// b1 and b2, half of its needs in one build only), with providers' entries
// and manifests (half of the bound needs bound): what two builds cost over
// one, in one run.
//
//	make bench
func BenchmarkComposeBuilds(b *testing.B) {
	perNode := map[string]float64{}
	for _, run := range []struct {
		name   string
		builds int
	}{{"one", 0}, {"two", 100}} {
		capture, err := synth.Generate(synth.Config{Nodes: 4, Modules: 60, Needs: 25, Builds: run.builds, Bound: 50}).Capture(registry.Table())
		if err != nil {
			b.Fatal(err)
		}
		replay, err := NewReplay(capture)
		if err != nil {
			b.Fatal(err)
		}
		nodes := nodesOf(capture)
		for _, n := range nodes { // order each node's keys first
			if _, err := replay.Compose(&provisionerv1.ComposeRequest{Node: n}); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(run.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				if _, err := replay.Compose(&provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]}); err != nil {
					b.Fatal(err)
				}
				i++
			}
			perNode[run.name] = float64(b.Elapsed().Nanoseconds()) / float64(i)
			b.ReportMetric(perNode[run.name], "ns/node")
		})
	}
	if one, two := perNode["one"], perNode["two"]; one > 0 && two > 0 {
		fmt.Printf("BenchmarkComposeBuilds: per node, one build %s; two builds %s (%.2fx; the goal is at most 1.3x)\n",
			time.Duration(one), time.Duration(two), two/one)
	}
}

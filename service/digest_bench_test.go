package service

import (
	"testing"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// BenchmarkDigest is what a plan digest adds to a composition of a node of
// 60 modules x 25 needs.
func BenchmarkDigest(b *testing.B) {
	capture := benchCapture(b, 1)
	replay, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	node := nodesOf(capture)[0]
	c, err := replay.Compose(&provisionerv1.ComposeRequest{Node: node})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		compose.Digest(c)
	}
}

package compose_test

import (
	"crypto/sha256"
	"fmt"
	"testing"
	"time"

	"github.com/zeebo/xxh3"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service/answers"
)

// BenchmarkDigest is what a plan digest adds to a composition of a node of
// 60 modules x 25 needs, against its floor in the same run: XXH3-128 alone
// of as many bytes as the digest hashes (each collection's items, hashed
// apart, not counted), which the digest's contract fixes; and SHA-256 of
// as many, the hash of the digest's first definition.
//
//	go test ./compose -run '^$' -bench BenchmarkDigest
func BenchmarkDigest(b *testing.B) {
	mesh := synth.Generate(synth.Config{Nodes: 1, Modules: 60, Needs: 25, Bound: 50})
	capture, err := mesh.Capture(registry.Table())
	if err != nil {
		b.Fatal(err)
	}
	replay, err := answers.NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	c, err := replay.Compose(&provisionerv1.ComposeRequest{Node: mesh.Nodes[0].Name})
	if err != nil {
		b.Fatal(err)
	}
	size := compose.DigestedBytes(c)
	var digest, floor, sha time.Duration
	b.Run("digest", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			compose.Digest(c)
		}
		digest = b.Elapsed() / time.Duration(b.N)
	})
	data := make([]byte, size)
	b.Run("xxh3 of as many bytes", func(b *testing.B) {
		b.SetBytes(int64(size))
		for b.Loop() {
			xxh3.Hash128(data)
		}
		floor = b.Elapsed() / time.Duration(b.N)
	})
	b.Run("sha256 of as many bytes", func(b *testing.B) {
		b.SetBytes(int64(size))
		for b.Loop() {
			sha256.Sum256(data)
		}
		sha = b.Elapsed() / time.Duration(b.N)
	})
	if digest > 0 && floor > 0 && sha > 0 {
		fmt.Printf("BenchmarkDigest: a 60 x 25 node's digest %s; XXH3-128 alone of its %d KB %s (%.0f%%), SHA-256 %s\n",
			digest, size>>10, floor, 100*float64(floor)/float64(digest), sha)
	}
}

package service

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/registry"
)

// BenchmarkMarshalJSON encodes the composition of a node of 30 modules x 10
// needs (the verbs bench's) in JSON: protojson whole, the baseline; the
// service's encoding with its elements found again, as after a write to
// one of the node's needs; and with every element new.
func BenchmarkMarshalJSON(b *testing.B) {
	capture, err := synth.Generate(synth.Config{Nodes: 1, Modules: 30, Needs: 10}).Capture(registry.Table())
	if err != nil {
		b.Fatal(err)
	}
	replay, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	answer, err := replay.Compose(&provisionerv1.ComposeRequest{Node: nodesOf(capture)[0]})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("protojson", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := protojson.Marshal(answer); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("found-again", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := marshalJSON(answer); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("new", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			jsonElements.reset()
			if _, err := marshalJSON(answer); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// reset empties the cache.
func (c *jsonCache) reset() {
	c.mu.Lock()
	c.byKey, c.bytes = nil, 0
	c.mu.Unlock()
}

package answers

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/synth"
)

// BenchmarkMarshalJSON encodes the composition of a node of 30 modules x 10
// needs (the verbs bench's) in JSON: protojson whole, the baseline; the
// service's encoding with its elements found again, as after a write to
// one of the node's needs; and with every element new.
func BenchmarkMarshalJSON(b *testing.B) {
	answer := composedSynth(b, synth.Config{Nodes: 1, Modules: 30, Needs: 10}) // as the verbs bench composes them
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

// BenchmarkMarshalCompose encodes the same composition in binary, and sizes
// it as a page is sized: proto.Marshal and proto.Size, the baselines, then
// the service's, which encode and size each list of collected items once.
func BenchmarkMarshalCompose(b *testing.B) {
	answer := composedSynth(b, synth.Config{Nodes: 1, Modules: 30, Needs: 10}) // as the verbs bench composes them
	for _, bb := range []struct {
		name string
		run  func() error
	}{
		{"proto.Marshal", func() error { _, err := deterministic.Marshal(answer); return err }},
		{"marshalCompose", func() error { _, err := marshalCompose(answer); return err }},
		{"proto.Size", func() error { proto.Size(answer); return nil }},
		{"sizeCompose", func() error { sizeCompose(answer); return nil }},
	} {
		b.Run(bb.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if err := bb.run(); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// reset empties the cache.
func (c *jsonCache) reset() {
	c.mu.Lock()
	c.byKey, c.bytes = nil, 0
	c.mu.Unlock()
}

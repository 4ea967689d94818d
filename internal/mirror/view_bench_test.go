package mirror

import (
	"fmt"
	"testing"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// BenchmarkGroupAfterAWrite reads a node of 30 modules x 10 needs after one
// of its needs was written: "reused" as the copy reads it, decoding that
// need alone, and "all", the baseline in the same run, decoding every need
// as a view made without a stale one does.
//
//	go test ./internal/mirror -run '^$' -bench BenchmarkGroupAfterAWrite
func BenchmarkGroupAfterAWrite(b *testing.B) {
	for _, name := range []string{"all", "reused"} {
		b.Run(name, func(b *testing.B) {
			c := New().Needs
			var keys []string
			for m := range 30 {
				for n := range 10 {
					keys = append(keys, fmt.Sprintf("node-1.module-%02d.port.need-%02d", m, n))
				}
			}
			revision := uint64(0)
			put := func(key string) {
				value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:" + key + "}", Provider: "postgres"})
				if err != nil {
					b.Fatal(err)
				}
				revision++
				c.Apply(key, value, revision, false)
			}
			for _, key := range keys {
				put(key)
			}
			c.MarkLoaded()
			c.Group("node-1")
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				put(keys[i%len(keys)])
				if name == "all" {
					c.groups["node-1"].stale.Store(nil)
				}
				if view, _, _ := c.Group("node-1"); len(view) != len(keys) {
					b.Fatalf("read %d needs, want %d", len(view), len(keys))
				}
				i++
			}
		})
	}
}

// BenchmarkPageOfEveryNode reads the first 10,000 needs of a copy of 1,000
// nodes x 300 needs in key order, as a page of every node's needs does:
// "after" through After, decoding the nodes it reaches, and "all", the
// baseline in the same run, through All, decoding every node.
//
//	go test ./internal/mirror -run '^$' -bench BenchmarkPageOfEveryNode
func BenchmarkPageOfEveryNode(b *testing.B) {
	c := New().Needs
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}", Provider: "postgres"})
	if err != nil {
		b.Fatal(err)
	}
	revision := uint64(0)
	for node := range 1000 {
		for need := range 300 {
			revision++
			c.Apply(fmt.Sprintf("node-%04d.module-%02d.port.need-%02d", node, need/10, need%10), value, revision, false)
		}
	}
	c.MarkLoaded()
	const page = 10_000
	for _, name := range []string{"all", "after"} {
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				n := 0
				if name == "all" {
					all, _ := c.All()
					n = len(all[:page])
				} else {
					for range c.After("") {
						if n++; n == page {
							break
						}
					}
				}
				if n != page {
					b.Fatalf("read %d needs, want %d", n, page)
				}
			}
		})
	}
}

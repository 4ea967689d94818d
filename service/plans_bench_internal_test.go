package service

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/natstest"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
)

// BenchmarkComposeForPlans is the writer's cost a node: a 1,000 x 30 x 10
// mesh, each node composed for its digest as RunPlans does.
func BenchmarkComposeForPlans(b *testing.B) {
	ctx := context.Background()
	nc := natstest.Connect(b, natstest.Start(b))
	js, _ := jetstream.New(nc)
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		b.Fatal(err)
	}
	kv, _ := js.KeyValue(ctx, keys.RegistryBucket)
	if _, err := registry.Reconcile(ctx, kv, registry.Table()); err != nil {
		b.Fatal(err)
	}
	mesh := synth.Generate(synth.Config{Nodes: 1000, Modules: 30, Needs: 10})
	if err := mesh.Write(ctx, js, 8, nil); err != nil {
		b.Fatal(err)
	}
	s, err := Start(ctx, Config{Conn: nc, NoAnswerCache: true})
	if err != nil {
		b.Fatal(err)
	}
	defer s.Stop()
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.WaitReady(wctx); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	i := 0
	for b.Loop() {
		if _, _, err := s.composeForPlans(mesh.Nodes[i%len(mesh.Nodes)].Name); err != nil {
			b.Fatal(err)
		}
		i++
	}
}

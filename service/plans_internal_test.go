package service

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/natstest"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
)

// The writer composes every node in turn: it keeps none of the decoded
// views, which would push out those that requests read again and, bounded
// as they are, hold the bound's worth of memory once every node is read.
func TestComposeForPlansKeepsNoDecodedView(t *testing.T) {
	t.Parallel()
	s, mesh, _ := startOnMesh(t, synth.Config{Nodes: 2, Modules: 3, Needs: 4}, Config{})
	// A view kept is found again: two reads give the same entries.
	kept := func(node string) bool {
		a, _, _ := s.mirror.Needs.GroupOnce(node)
		b, _, _ := s.mirror.Needs.GroupOnce(node)
		return len(a) > 0 && a[0] == b[0]
	}
	written, read := mesh.Nodes[0].Name, mesh.Nodes[1].Name
	if _, err := s.composeForPlans(written); err != nil {
		t.Fatal(err)
	}
	if kept(written) {
		t.Errorf("composing %s for its plan digest kept its decoded view", written)
	}
	// A request's composition keeps them, which the check above sees.
	if _, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: read}, encoding{}, unpaged, reading{views: keepViews}); werr != nil {
		t.Fatal(werr)
	}
	if !kept(read) {
		t.Errorf("composing %s for a request kept no decoded view", read)
	}
}

// startOnMesh writes a synthetic mesh into an embedded server's buckets,
// with the registry's table, and starts a service on it, ready.
func startOnMesh(t testing.TB, meshConfig synth.Config, cfg Config) (*Service, *synth.Mesh, *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Reconcile(ctx, kv, registry.Table()); err != nil {
		t.Fatal(err)
	}
	mesh := synth.Generate(meshConfig)
	if err := mesh.Write(ctx, js, 8, nil); err != nil {
		t.Fatal(err)
	}
	cfg.Conn = nc
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return s, mesh, nc
}

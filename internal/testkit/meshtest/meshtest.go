// Package meshtest writes a synthetic mesh into a real nats-server for the
// tests of the service's parts: the buckets made as serve makes them, the
// registry's table reconciled into its bucket, and the mesh's records
// written, before any copy of them is opened. It imports nothing of the
// service, so that the tests inside its rooms may use it too.
package meshtest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
)

// Write makes the provisioning buckets through nc, reconciles the
// registry's table into them and writes the synthetic mesh cfg describes,
// which it returns.
func Write(t testing.TB, nc *nats.Conn, cfg synth.Config) *synth.Mesh {
	t.Helper()
	ctx := context.Background()
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
	mesh := synth.Generate(cfg)
	if err := mesh.Write(ctx, js, 8, nil); err != nil {
		t.Fatal(err)
	}
	return mesh
}

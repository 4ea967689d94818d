// Package servicetest runs the mesh-provisioner service for tests: buckets
// created, registry reconciled, copy loaded.
package servicetest

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
)

// Start creates the buckets on nc's server, reconciles the registry, starts
// the service and waits until it is ready. It stops the service when the
// test ends. Options change the service's configuration.
func Start(t testing.TB, nc *nats.Conn, options ...func(*service.Config)) *service.Service {
	t.Helper()
	return StartAs(t, nc, nc, options...)
}

// StartAs is Start with the server's two identities, as serve runs it: the
// service answers on nc, and the buckets are made, reconciled and watched
// through writer. The instance neither contends for the seat nor writes
// plans (RunPlans does, for a test that wants them): the test owns the
// registry, reconciled once here.
func StartAs(t testing.TB, nc, writer *nats.Conn, options ...func(*service.Config)) *service.Service {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg := service.Config{Conn: nc, WatchConn: writer, Version: "1.2.3"}
	for _, option := range options {
		option(&cfg)
	}
	inst, err := instance.Start(ctx, instance.Config{Service: cfg})
	if err != nil {
		t.Fatal(err)
	}
	svc := inst.Service()
	t.Cleanup(inst.Stop)
	report, err := registry.Reconcile(ctx, Bucket(t, writer, keys.RegistryBucket), registry.Table())
	if err != nil {
		t.Fatal(err)
	}
	if err := svc.WaitReady(ctx); err != nil {
		t.Fatal(err)
	}
	if err := svc.WaitRegistry(ctx, report.Revision); err != nil {
		t.Fatal(err)
	}
	return svc
}

// Buckets creates the provisioning buckets on nc's server, as serve does,
// and returns nc's JetStream.
func Buckets(t testing.TB, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	return js
}

// Bucket returns a handle on a provisioning bucket.
func Bucket(t testing.TB, nc *nats.Conn, bucket string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), bucket)
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// RunPlans keeps mesh-provisioner_plans through writer, as the seat's
// holder does, until the test ends.
func RunPlans(t testing.TB, svc *service.Service, writer *nats.Conn, interval time.Duration) {
	t.Helper()
	kv := Bucket(t, writer, keys.PlansBucket)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- svc.RunPlans(ctx, service.PlansConfig{KV: kv, Interval: interval}) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunPlans: %v", err)
		}
	})
}

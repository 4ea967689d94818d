package instance_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
)

// TestRunServesWritesAndHandsTheSeatBack runs one instance from nothing: it
// makes the buckets, takes the seat, writes the registry, says it serves,
// writes a node's plan digest when the node's need arrives, and on its
// context's end hands the seat back and stops answering.
func TestRunServesWritesAndHandsTheSeatBack(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	inst, err := instance.Start(ctx, instance.Config{
		Service:       service.Config{Conn: nc, WatchConn: nc, Logger: slog.New(slog.DiscardHandler)},
		PlansInterval: 10 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- inst.Run(runCtx) }()
	select {
	case <-inst.Serving():
	case err := <-done:
		t.Fatalf("Run ended before serving: %v", err)
	case <-ctx.Done():
		t.Fatal("the instance did not serve within 30s")
	}
	if held, _ := inst.Seat().Held(); !held {
		t.Fatal("the only instance serves without holding the seat")
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	registryKV, err := js.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		t.Fatal(err)
	}
	for _, entry := range registry.Table() {
		if _, err := registryKV.Get(ctx, entry.GetKind()); err != nil {
			t.Errorf("the registry's entry %q: %v", entry.GetKind(), err)
		}
	}

	// A need written (directly: this test's identity may) is composed into
	// the node's plan digest by the seat's holder.
	needs, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := needs.Put(ctx, "ace.web.port.http", value); err != nil {
		t.Fatal(err)
	}
	plans, err := js.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, func() error {
		_, err := plans.Get(ctx, "ace")
		return err
	})

	stop()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run: %v", err)
		}
	case <-ctx.Done():
		t.Fatal("Run did not return within 30s of its context's end")
	}
	if held, _ := inst.Seat().Held(); held {
		t.Error("the seat is still held after Run returned")
	}
	if _, err := nc.Request("$SRV.PING.mesh-provisioner", nil, 200*time.Millisecond); err == nil {
		t.Error("the stopped instance still answers discovery")
	}
}

// TestStartRefusesAConfigAtOnce: what no retry mends is refused before
// anything is tried, not tried again until the context ends.
func TestStartRefusesAConfigAtOnce(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	for _, tc := range []struct {
		name string
		cfg  instance.Config
		want string
	}{
		{"no writing connection", instance.Config{Service: service.Config{Conn: nc}}, "WatchConn is required"},
		{"no answering connection", instance.Config{Service: service.Config{WatchConn: nc}}, "Conn is required"},
		{"a negative concurrency", instance.Config{Service: service.Config{Conn: nc, WatchConn: nc, Concurrency: -1}}, "Config.Concurrency is negative"},
		{"a reply prefix into JetStream", instance.Config{Service: service.Config{Conn: nc, WatchConn: nc, ReplyPrefixes: []string{"$JS."}}}, "$JS."},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			_, err := instance.Start(ctx, tc.cfg)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Start: %v, want an error containing %q", err, tc.want)
			}
			if ctx.Err() != nil {
				t.Fatalf("Start tried again until its context ended: %v", err)
			}
		})
	}
}

// TestStartSaysJetStreamIsOff: a NATS without JetStream is named in one
// sentence that says what to do, not a "no responders" from the first
// bucket call.
func TestStartSaysJetStreamIsOff(t *testing.T) {
	t.Parallel()
	s := natstest.StartWithoutJetStream(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	_, err := instance.Start(ctx, instance.Config{Service: service.Config{Conn: nc, WatchConn: nc}})
	if !errors.Is(err, instance.ErrJetStreamNotEnabled) {
		t.Fatalf("Start: %v, want ErrJetStreamNotEnabled", err)
	}
	if want := fmt.Sprintf("at %s; enable it", s.ClientURL()); !strings.Contains(err.Error(), want) {
		t.Errorf("Start: %q, want it to contain %q", err, want)
	}
}

// TestContendHandsTheSeatBackAndKeepsServing: an instance that stops
// contending hands the seat back and answers on as a standby, until Stop.
func TestContendHandsTheSeatBackAndKeepsServing(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	inst, nc := startStandby(ctx, t)
	contending, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- inst.Contend(contending) }()
	natstest.CheckFor(t, 10*time.Second, func() error {
		if held, _ := inst.Seat().Held(); !held {
			return errors.New("the only instance does not hold the seat")
		}
		return nil
	})
	stop()
	if err := <-done; err != nil {
		t.Fatalf("Contend: %v", err)
	}
	if held, _ := inst.Seat().Held(); held {
		t.Error("the seat is still held after Contend returned")
	}
	if _, err := nc.Request("$SRV.PING.mesh-provisioner", nil, 2*time.Second); err != nil {
		t.Errorf("the standby does not answer discovery: %v", err)
	}
}

// Contend runs once at a time: a second call while the first contends is
// refused, and the first goes on.
func TestContendRunsOnceAtATime(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	inst, _ := startStandby(ctx, t)
	contending, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- inst.Contend(contending) }()
	select {
	case <-inst.Serving():
	case <-ctx.Done():
		t.Fatal("the instance did not serve within 30s")
	}
	if err := inst.Contend(ctx); !errors.Is(err, instance.ErrContending) {
		t.Errorf("a second Contend: %v, want ErrContending", err)
	}
	stop()
	if err := <-done; err != nil {
		t.Fatalf("the first Contend: %v", err)
	}
}

// startStandby starts an instance on a server of its own, not contending
// for the seat, and stops it when the test ends.
func startStandby(ctx context.Context, t *testing.T) (*instance.Instance, *nats.Conn) {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	inst, err := instance.Start(ctx, instance.Config{Service: service.Config{Conn: nc, WatchConn: nc, Logger: slog.New(slog.DiscardHandler)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(inst.Stop)
	return inst, nc
}

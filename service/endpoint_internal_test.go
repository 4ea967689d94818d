package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// No more answers are built at once than Config.Concurrency.
func TestWorkersAreBounded(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	s := start(t, nc, Config{Concurrency: 2})
	var running, most atomic.Int32
	release := make(chan struct{})
	var released sync.Once
	releaseAll := func() { released.Do(func() { close(release) }) }
	t.Cleanup(releaseAll) // before the service stops, should the test fail first
	var asked atomic.Int64
	blocking := endpoint[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse]{Verb: answers.Verb[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse]{
		Name: "blocking", Subject: "test.blocking",
		NewRequest: func() *provisionerv1.ProvisioningRequest { return &provisionerv1.ProvisioningRequest{} },
		Check:      func(*provisionerv1.ProvisioningRequest) *wire.Error { return nil },
		Waits:      func(*provisionerv1.ProvisioningRequest) []answers.RevisionWait { return nil },
		// Each request a key of its own: no answer is reused, nor shared.
		KeyOf:   func(*provisionerv1.ProvisioningRequest) string { return strconv.FormatInt(asked.Add(1), 10) },
		StampOf: func(*provisionerv1.ProvisioningRequest) answers.Stamp { return answers.Stamp{} },
		Tail: func(*provisionerv1.ProvisioningRequest, answers.Timings, mirror.Revisions) *provisionerv1.ProvisioningResponse {
			return &provisionerv1.ProvisioningResponse{}
		},
		Answer: func(*provisionerv1.ProvisioningRequest, answers.Encoding, answers.Budget) (*provisionerv1.ProvisioningResponse, answers.Timings, func(), *wire.Error) {
			n := running.Add(1)
			for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
			}
			<-release
			running.Add(-1)
			return &provisionerv1.ProvisioningResponse{}, answers.Timings{}, nil, nil
		},
	}}
	s.counters["blocking"] = &counters{subject: "test.blocking"} // as Start makes them; no stats are asked here
	if err := blocking.register(s, s.micro, nil); err != nil {
		t.Fatal(err)
	}
	const requests = 5
	replies := make(chan error, requests)
	for range requests {
		go func() {
			_, err := nc.Request("test.blocking", nil, 10*time.Second)
			replies <- err
		}()
	}
	// Wait until the workers are busy and the other requests wait in the
	// queue for them: were there a third worker, it would have taken one
	// of those, and the queue would never hold them all.
	natstest.CheckFor(t, 5*time.Second, func() error {
		if n, queued := running.Load(), len(s.queue); n < 2 || queued != requests-2 {
			return fmt.Errorf("%d answers at work and %d requests queued, want 2 and %d", n, queued, requests-2)
		}
		return nil
	})
	releaseAll()
	for range requests {
		if err := <-replies; err != nil {
			t.Error(err)
		}
	}
	if got := most.Load(); got != 2 {
		t.Errorf("at most %d answers were built at once, want 2 (Concurrency)", got)
	}
}

// Stop answers the requests that wait for a revision with a 503, and
// returns once they are answered.
func TestStopAnswersWaitingRequests(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	s := start(t, nc, Config{RevisionWait: time.Minute})
	asked := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: 1 << 40})
		asked <- err
	}()
	natstest.CheckFor(t, 5*time.Second, func() error {
		if n := len(s.waiting); n != 1 {
			return fmt.Errorf("%d requests wait, want 1", n)
		}
		return nil
	})
	stopped := make(chan struct{})
	go func() { s.Stop(); close(stopped) }()
	// The bound is the point, and robust: without Stop's answer the request
	// waits its RevisionWait, a minute, twelve times the bound.
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		t.Fatal("Stop did not return within 5s of a waiting request")
	}
	err := <-asked
	if wire.CodeOf(err) != wire.CodeUnavailable {
		t.Errorf("the waiting request got %v, want a 503 saying the server is stopping", err)
	}
	// The connection stays open, and nothing answers any more.
	if _, err := nc.Request(wire.ProvisioningSubject, nil, 200*time.Millisecond); err == nil || nc.IsClosed() {
		t.Errorf("after Stop: %v (closed %v), want no answer on an open connection", err, nc.IsClosed())
	}
}

// start runs the service on nc's server with cfg, its buckets created, and
// stops it when the test ends. (servicetest imports this package.)
func start(t *testing.T, nc *nats.Conn, cfg Config) *Service {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(t.Context(), js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	cfg.Conn = nc
	s, err := Start(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	if err := s.WaitReady(t.Context()); err != nil {
		t.Fatal(err)
	}
	return s
}

// Until some instance has written the registry, a composition would refuse
// every need: compose answers 503 instead, and provisioning answers.
func TestComposeWaitsForTheRegistry(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	s := start(t, nc, Config{})
	c := client.New(nc)
	_, err := c.Compose(t.Context(), &provisionerv1.ComposeRequest{Node: "ace"})
	if wire.CodeOf(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "registry is empty") {
		t.Errorf("compose with an empty registry: %v, want a 503 saying so", err)
	}
	if _, err := c.Provisioning(t.Context(), &provisionerv1.ProvisioningRequest{}); err != nil {
		t.Errorf("provisioning with an empty registry: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := s.WaitRegistry(ctx, 0); err == nil {
		t.Error("WaitRegistry returned with the registry empty")
	}
}

package service

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/wire"
)

// Many identical requests at once (a small page of a large node, whose
// build composes it whole for the digest), whose answer is not kept yet, are
// answered from one build: none is refused for a full queue, which copies
// of the one computation filled before (a flood of one request after each
// write refused every other asker).
func TestIdenticalRequestsShareABuild(t *testing.T) {
	t.Parallel()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 1, Modules: 200, Needs: 25}, Config{Concurrency: 1})
	floodOfOne(t, s, nc, mesh.Nodes[0].Name)
}

// The same flood while the providers' buckets that the node's needs name
// are not read yet: each request waits for them, then is answered as one
// that came now, from one build. Each went to the queue on its own before,
// and all but the queue's worth were refused at once when the buckets came
// (471 of 600; the flood of a node's first compose on a slow machine).
func TestIdenticalRequestsThatWaitedShareABuild(t *testing.T) {
	t.Parallel()
	// The service may not make the providers' buckets' watchers: their
	// reads fail once nats.go stops waiting for the API's answer (some
	// 5 s), long after the flood has come, and every request waits for
	// that (its buckets then read as failing).
	var deny []string
	for _, provider := range []string{"pg", "redis", "s3", "kafka"} { // synth's
		create := "$JS.API.CONSUMER.CREATE." + wire.StreamOf(wire.BoundBucket(provider))
		deny = append(deny, create, create+".>")
	}
	s, mesh, nc := startOnMeshDenying(t, deny, synth.Config{Nodes: 1, Modules: 200, Needs: 25, Bound: 50},
		Config{Concurrency: 1, RevisionWait: time.Minute})
	floodOfOne(t, s, nc, mesh.Nodes[0].Name)
}

// floodOfOne asks the compose of node 600 times at once, each the same small
// page, of a service with one worker, whose queue holds 128: every request
// must be answered, none refused for a full queue.
func floodOfOne(t *testing.T, s *Service, nc *nats.Conn, node string) {
	t.Helper()
	const asked = 600
	ask := client.New(nc)
	var (
		asking sync.WaitGroup
		mu     sync.Mutex
		errs   []error
	)
	for range asked {
		asking.Go(func() {
			if _, err := ask.Compose(context.Background(), &provisionerv1.ComposeRequest{Node: node, PageSize: 5}); err != nil {
				mu.Lock()
				errs = append(errs, err)
				mu.Unlock()
			}
		})
	}
	asking.Wait()
	if len(errs) > 0 {
		t.Errorf("%d of %d identical requests failed; the first: %v", len(errs), asked, errs[0])
	}
	if n := s.counters[wire.ComposeEndpoint].queueFull.Load(); n > 0 {
		t.Errorf("%d identical requests were refused for a full queue, want none", n)
	}
}

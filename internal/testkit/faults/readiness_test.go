//go:build faults

package faults_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// fill writes nodes x perNode needs, concurrently, and returns the last
// revision.
func fill(t *testing.T, needs jetstream.KeyValue, nodes, perNode int) uint64 {
	t.Helper()
	value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:x}", Provider: "pg"})
	var last atomic.Uint64
	var wg sync.WaitGroup
	for w := range 8 {
		wg.Go(func() {
			for n := w; n < nodes; n += 8 {
				for i := range perNode {
					rev, err := needs.Put(context.Background(), fmt.Sprintf("n%d.web.port.p%d", n, i), value)
					if err != nil {
						t.Error(err)
						return
					}
					for m := last.Load(); rev > m && !last.CompareAndSwap(m, rev); m = last.Load() {
					}
				}
			}
		})
	}
	wg.Wait()
	return last.Load()
}

// TestFaultRestartBesideReadyInstances restarts an instance beside two
// ready ones while a client asks without pause: the restarted instance takes
// no request from the queue group until its copy is whole, so no request is
// answered "still loading".
func TestFaultRestartBesideReadyInstances(t *testing.T) {
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	servicetest.Start(t, nc, func(cfg *service.Config) { cfg.Logger = logger(t) })
	servicetest.Start(t, natstest.Connect(t, s), func(cfg *service.Config) { cfg.Logger = logger(t) })
	last := fill(t, servicetest.Bucket(t, nc, keys.NeedsBucket), 500, 100) // 50,000 keys: a load long enough to be asked during
	ask := client.New(natstest.Connect(t, s))
	var asked, loading, failed atomic.Int64
	var firstLoading atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
				_, err := ask.Provisioning(rctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "n1", MinRevision: last})
				rcancel()
				if ctx.Err() != nil {
					return
				}
				asked.Add(1)
				var werr *wire.Error
				switch {
				case errors.As(err, &werr) && strings.Contains(werr.Error(), "loading"):
					loading.Add(1)
					firstLoading.CompareAndSwap(nil, werr.Error())
				case err != nil:
					failed.Add(1)
				}
			}
		})
	}
	natstest.CheckFor(t, 10*time.Second, func() error { // the askers are at work
		if n := asked.Load(); n < 100 {
			return fmt.Errorf("%d requests asked, want 100 before the restarts", n)
		}
		return nil
	})
	for round := range 3 {
		start := time.Now()
		third, err := service.Start(context.Background(), service.Config{Conn: natstest.Connect(t, s), Logger: logger(t)})
		if err != nil {
			t.Fatal(err)
		}
		if err := third.WaitReady(context.Background()); err != nil {
			t.Fatal(err)
		}
		loaded := time.Since(start)
		natstest.CheckFor(t, 10*time.Second, func() error { // it takes its share of the requests
			var answered int
			for _, e := range third.Stats().Endpoints {
				answered += e.NumRequests
			}
			if answered < 20 {
				return fmt.Errorf("the third instance answered %d requests, want 20 before it stops", answered)
			}
			return nil
		})
		third.Stop()
		t.Logf("round %d: the third instance loaded 50,000 keys in %s", round+1, loaded.Round(time.Millisecond))
	}
	cancel()
	wg.Wait()
	t.Logf("%d requests asked while an instance started three times beside two ready ones: %d answered \"loading\", %d failed otherwise",
		asked.Load(), loading.Load(), failed.Load())
	if loading.Load() > 0 {
		t.Errorf("%d requests were answered by a loading instance, such as: %v", loading.Load(), firstLoading.Load())
	}
	if failed.Load() > 0 {
		t.Errorf("%d requests failed", failed.Load())
	}
}

// TestFaultPurgedBucket purges the needs bucket as an operator would, with
// writes going on: the copy notices, says behind meanwhile, and holds again
// what the bucket holds.
func TestFaultPurgedBucket(t *testing.T) {
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	servicetest.Start(t, nc, func(cfg *service.Config) { cfg.Logger = logger(t) })
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	last := fill(t, needs, 20, 20)
	ask := client.New(natstest.Connect(t, s))
	count := func() (int, []string) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		res, err := ask.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "n1", MinRevision: last})
		if err != nil {
			return -1, nil
		}
		return len(res.GetNeeds()), res.GetBehind()
	}
	if n, _ := count(); n != 20 {
		t.Fatalf("before the purge, n1 has %d needs, want 20", n)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	natstest.Purge(context.Background(), t, js, wire.StreamOf(keys.NeedsBucket))
	purged := time.Now()
	sawBehind := false
	natstest.CheckFor(t, 5*time.Second, func() error {
		n, behind := count()
		sawBehind = sawBehind || len(behind) > 0
		if n != 0 || len(behind) != 0 {
			return fmt.Errorf("after the purge, n1 still has %d needs in answers (behind %v)", n, behind)
		}
		return nil
	})
	t.Logf("purged: answers held what the bucket holds %s after the purge; an answer said behind meanwhile: %v",
		time.Since(purged).Round(time.Millisecond), sawBehind)
	if !sawBehind {
		t.Error("no answer said the copy was behind between the purge and the reload")
	}
}

// TestFaultRestartAlone restarts the only instance of a mesh of 50,000
// keys while nodes ask for their plans without pause, at the last revision:
// it answers them from each node's keys read alone before its copy is
// whole, and every answer is the node's whole plan.
func TestFaultRestartAlone(t *testing.T) {
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	first := servicetest.Start(t, nc, func(cfg *service.Config) { cfg.Logger = logger(t) })
	last := fill(t, servicetest.Bucket(t, nc, keys.NeedsBucket), 500, 100) // 50,000 keys: a load long enough to be asked during
	first.Stop()

	ask := client.New(natstest.Connect(t, s))
	started := time.Now()
	second, err := service.Start(context.Background(), service.Config{Conn: natstest.Connect(t, s), Logger: logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(second.Stop)
	var answered, loading, failed atomic.Int64
	var firstAnswer atomic.Int64 // nanoseconds after Start
	var firstFailure atomic.Value
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := w; ctx.Err() == nil; i += 4 {
				node := fmt.Sprintf("n%d", i*37%500)
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				plan, err := ask.Compose(rctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: &provisionerv1.Revisions{Needs: last}})
				rcancel()
				var werr *wire.Error
				switch {
				case ctx.Err() != nil:
					return
				case errors.As(err, &werr) && werr.Code() == wire.CodeUnavailable && strings.Contains(werr.Sentence(), "loading"):
					loading.Add(1)
				case err != nil:
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, err.Error())
				case len(plan.GetPlans()) != 1 || len(plan.GetPlans()[0].GetItems()) != 100:
					failed.Add(1)
					firstFailure.CompareAndSwap(nil, fmt.Sprintf("%s's plan: %d plans, want one of 100 items", node, len(plan.GetPlans())))
				default:
					answered.Add(1)
					firstAnswer.CompareAndSwap(0, int64(time.Since(started)))
				}
			}
		})
	}
	if err := second.WaitReady(context.Background()); err != nil {
		t.Fatal(err)
	}
	whole := time.Since(started)
	// Asked on once the copy is whole: a few more plans answered from it.
	ready := answered.Load()
	natstest.CheckFor(t, 30*time.Second, func() error {
		if n := answered.Load() - ready; n < 8 {
			return fmt.Errorf("%d plans answered since the copy was whole, want 8 (%d failed)", n, failed.Load())
		}
		return nil
	})
	cancel()
	wg.Wait()
	t.Logf("the only instance restarted on 50,000 keys: first plan %s after Start, copy whole after %s; %d plans answered, %d answered \"loading\", %d failed",
		time.Duration(firstAnswer.Load()).Round(time.Millisecond), whole.Round(time.Millisecond), answered.Load(), loading.Load(), failed.Load())
	if failed.Load() > 0 {
		t.Errorf("%d requests failed, such as: %v", failed.Load(), firstFailure.Load())
	}
	if at := time.Duration(firstAnswer.Load()); at == 0 || at >= whole {
		t.Errorf("the first plan came %s after Start, the copy whole %s after: want a plan before the copy is whole", at, whole)
	}
}

package service_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// A partition moves from one instance to another without a request
// failing: the one taking it on reads its nodes and serves it beside the
// one letting it go, which then stops answering it and drops its nodes.
// Meanwhile an operator composes every node and a node of the partition
// writes, through either instance.
func TestHoldMovesAPartitionBetweenInstances(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const partitions, moved = 4, 2
	server := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, server)
	holding := func(hold ...int) func(*service.Config) {
		return func(c *service.Config) {
			c.Partitions, c.Hold, c.HoldChanges = partitions, hold, true
			c.SetReleaseGrace(200 * time.Millisecond)
		}
	}
	low := servicetest.Start(t, natstest.Connect(t, server), holding(0, 1))
	high := servicetest.Start(t, natstest.Connect(t, server), holding(2, 3))

	var nodes []string
	var writer string // a node of the partition moved
	count := map[int]int{}
	for i := 0; len(nodes) < 2*partitions; i++ {
		name := fmt.Sprintf("n%d", i)
		if p := wire.PartitionOf(name, partitions); count[p] < 2 {
			count[p]++
			nodes = append(nodes, name)
			if p == moved {
				writer = name
			}
		}
	}
	slices.Sort(nodes)
	clients := map[string]*nodeclient.Client{}
	var last uint64
	for _, node := range nodes {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		clients[node] = c
		rev, err := c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, rev)
	}
	nodesHeld := func(svc *service.Service) (int, uint64) {
		for _, b := range statsData(t, svc).GetBuckets() {
			if b.GetBucket() == keys.NeedsBucket {
				return int(b.GetNodes()), b.GetRevision()
			}
		}
		return -1, 0
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if n, rev := nodesHeld(high); n != 4 || rev < last {
			return fmt.Errorf("high holds %d nodes at %d, want 4 at %d", n, rev, last)
		}
		return nil
	})

	// Asked all along: every node's composition by an operator, and a
	// write of the moved partition's node.
	moving, stopAsking := context.WithCancel(ctx)
	var asked, wrote atomic.Int64
	var failures sync.Map
	var wg sync.WaitGroup
	operator := client.New(nc)
	wg.Go(func() {
		for moving.Err() == nil {
			for _, node := range nodes {
				plan, err := operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: &provisionerv1.Revisions{Needs: last}})
				switch {
				case err != nil:
					failures.Store("compose "+node+": "+err.Error(), true)
				case itemsOf(plan, "web") == 0:
					failures.Store(fmt.Sprintf("compose %s: no item of module web: %v", node, plan), true)
				}
				asked.Add(1)
			}
		}
	})
	wg.Go(func() {
		for i := 0; moving.Err() == nil; i++ {
			if _, err := clients[writer].PutNeed(ctx, "api", "port", "http", &provisionerv1.Need{Placeholder: fmt.Sprintf("${port:http%d}", i%2)}); err != nil {
				failures.Store("write of "+writer+": "+err.Error(), true)
			}
			wrote.Add(1)
			time.Sleep(5 * time.Millisecond)
		}
	})
	askedSome := func(stage string) {
		t.Helper()
		a, w := asked.Load(), wrote.Load()
		natstest.CheckFor(t, 5*time.Second, func() error {
			if asked.Load() < a+2*int64(len(nodes)) || wrote.Load() < w+5 {
				return fmt.Errorf("%s: few requests answered", stage)
			}
			return nil
		})
	}
	askedSome("before the move")

	if err := low.Hold(ctx, []int{0, 1, moved}); err != nil {
		t.Fatalf("low taking partition %d on: %v", moved, err)
	}
	if diff := cmp.Diff([]int{0, 1, moved}, low.Held()); diff != "" {
		t.Errorf("low serves (-want +got):\n%s", diff)
	}
	if n, _ := nodesHeld(low); n != 6 {
		t.Errorf("low holds %d nodes once it serves partition %d, want 6", n, moved)
	}
	askedSome("both serving")
	if err := high.Hold(ctx, []int{3}); err != nil {
		t.Fatalf("high letting partition %d go: %v", moved, err)
	}
	if diff := cmp.Diff([]int{3}, high.Held()); diff != "" {
		t.Errorf("high serves (-want +got):\n%s", diff)
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if n, _ := nodesHeld(high); n != 2 {
			return fmt.Errorf("high holds %d nodes after letting partition %d go, want 2", n, moved)
		}
		return nil
	})
	askedSome("after the move")
	stopAsking()
	wg.Wait()
	failures.Range(func(failure, _ any) bool {
		t.Error(failure)
		return true
	})

	// The moved node's write is low's alone now, and read by either.
	rev, err := clients[writer].PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"})
	if err != nil {
		t.Fatal(err)
	}
	for range 4 {
		plan, err := operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: writer, MinRevisions: &provisionerv1.Revisions{Needs: rev}})
		if err != nil {
			t.Fatal(err)
		}
		if got := itemsOf(plan, "web"); got != 2 {
			t.Errorf("%s's compose after the move: %d items of module web, want 2", writer, got)
		}
	}
	if data := statsData(t, high); data.GetRelayed() == 0 {
		t.Error("high handed no request on to low")
	}
}

// itemsOf returns how many items a composition plans for module.
func itemsOf(plan *provisionerv1.ComposeResponse, module string) int {
	for _, m := range plan.GetPlans() {
		if m.GetModule() == module {
			return len(m.GetItems())
		}
	}
	return 0
}

// A Hold cut short serves nothing it has not read; the next Hold of the
// same partition waits for the read that was cut short, and serves it
// whole.
func TestHoldCutShortServesNothingUnread(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const partitions = 2
	server := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, server)
	svc := servicetest.Start(t, natstest.Connect(t, server), func(c *service.Config) {
		c.Partitions, c.Hold, c.HoldChanges = partitions, []int{0}, true
	})
	node := nodesOf(1, partitions, 1)[0]
	// Written directly (this test's identity may): partition 1 has no
	// instance to write through.
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	var last uint64
	for i := range 200 {
		value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: fmt.Sprintf("${port:p%d}", i)})
		rev, err := needs.Put(ctx, fmt.Sprintf("%s.web.port.p%d", node, i), value)
		if err != nil {
			t.Fatal(err)
		}
		last = rev
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		for _, b := range statsData(t, svc).GetBuckets() {
			if b.GetBucket() == keys.NeedsBucket && b.GetRevision() < last {
				return fmt.Errorf("the copy of needs at %d, want %d", b.GetRevision(), last)
			}
		}
		return nil
	})

	cutShort, cancelHold := context.WithCancel(ctx)
	cancelHold()
	if err := svc.Hold(cutShort, []int{0, 1}); err == nil {
		t.Fatal("a Hold whose context ended took partition 1 on")
	}
	if diff := cmp.Diff([]int{0}, svc.Held()); diff != "" {
		t.Errorf("served after a Hold cut short (-want +got):\n%s", diff)
	}
	if err := svc.Hold(ctx, []int{0, 1}); err != nil {
		t.Fatal(err)
	}
	operator := client.New(nc)
	plan, err := operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: node})
	if err != nil {
		t.Fatal(err)
	}
	if got := itemsOf(plan, "web"); got != 200 {
		t.Errorf("%s's compose once partition 1 is served: %d items, want 200", node, got)
	}
}

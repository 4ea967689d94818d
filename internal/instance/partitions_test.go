package instance_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// Instances that serve some partitions each write the plans of their
// partitions' nodes, each partition's by the holder of its seat: two
// instances of two partitions each keep every node's plan, and a third
// that serves the same two as one of them stands by, and takes their
// seats and their plans when that one stops.
func TestEachPartitionsSeatWritesItsPlans(t *testing.T) {
	t.Parallel()
	const partitions = 4
	s := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	run := func(hold ...int) (*instance.Instance, context.CancelFunc) {
		t.Helper()
		conn := natstest.Connect(t, s)
		inst, err := instance.Start(ctx, instance.Config{
			Service:       service.Config{Conn: conn, WatchConn: conn, Partitions: partitions, Hold: hold, Logger: slog.New(slog.DiscardHandler)},
			PlansInterval: 10 * time.Millisecond,
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- inst.Run(runCtx) }()
		var once sync.Once
		stopped := func() {
			once.Do(func() {
				stop()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			})
		}
		t.Cleanup(stopped)
		select {
		case <-inst.Serving():
		case err := <-done:
			t.Fatalf("Run ended before serving: %v", err)
		}
		return inst, stopped
	}
	low, stopLow := run(0, 1)
	high, _ := run(2, 3)
	seats := func(inst *instance.Instance, want ...int) func() error {
		return func() error {
			if got := inst.PartitionSeats(); !slices.Equal(got, want) {
				return fmt.Errorf("the instance holds the seats of %v, want %v", got, want)
			}
			return nil
		}
	}
	natstest.CheckFor(t, 10*time.Second, seats(low, 0, 1))
	natstest.CheckFor(t, 10*time.Second, seats(high, 2, 3))
	standby, _ := run(0, 1)

	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	needs, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := js.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	// A node of each partition; each need written directly (this test's
	// identity may), its plan's revision awaited.
	var nodes []string
	for i := 0; len(nodes) < partitions; i++ {
		if name := fmt.Sprintf("n%d", i); wire.PartitionOf(name, partitions) == len(nodes) {
			nodes = append(nodes, name)
			i = -1
		}
	}
	value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	written := func(module string) {
		t.Helper()
		revs := map[string]uint64{}
		for _, node := range nodes {
			rev, err := needs.Put(ctx, node+"."+module+".port.http", value)
			if err != nil {
				t.Fatal(err)
			}
			revs[node] = rev
		}
		natstest.CheckFor(t, 10*time.Second, func() error {
			for _, node := range nodes {
				e, err := plans.Get(ctx, node)
				if err != nil {
					return fmt.Errorf("%s's plan: %w", node, err)
				}
				d := &provisionerv1.PlanDigest{}
				if err := proto.Unmarshal(e.Value(), d); err != nil {
					return fmt.Errorf("%s's plan: %w", node, err)
				}
				if d.GetRevisions().GetNeeds() < revs[node] {
					return fmt.Errorf("%s's plan at needs revision %d, want %d", node, d.GetRevisions().GetNeeds(), revs[node])
				}
			}
			return nil
		})
	}
	written("web")
	natstest.CheckFor(t, time.Second, seats(standby))
	if n := plansWritten(t, standby); n != 0 {
		t.Errorf("the standby, which holds no seat, wrote %d plans", n)
	}

	// The holder of 0 and 1 stops: it hands their seats back, the standby
	// takes them, and writes their nodes' plans.
	stopLow()
	natstest.CheckFor(t, 10*time.Second, seats(standby, 0, 1))
	written("api")
}

// plansWritten returns the plan digests inst has written.
func plansWritten(t *testing.T, inst *instance.Instance) uint64 {
	t.Helper()
	endpoints := inst.Service().Stats().Endpoints
	if len(endpoints) == 0 {
		t.Fatal("no endpoint")
	}
	data, err := wire.DecodeStatsData(endpoints[0].Data) // the service's counts, on each endpoint
	if err != nil {
		t.Fatal(err)
	}
	return data.GetPlans().GetWritten()
}

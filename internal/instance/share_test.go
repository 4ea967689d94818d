package instance_test

import (
	"context"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// Instances that share the partitions deal them among themselves as they
// come and go: one alone serves every partition; a second takes its share
// on, which the first lets go; when the second stops, it hands its share
// back before it stops, and the first serves every partition again.
// Throughout, each partition's seat is held by the instance that serves
// it, every node's plan is written, and every composition asked is
// answered, but for at most one in flight at the instance stopping (a
// retryable 503).
func TestInstancesShareThePartitionsAsTheyComeAndGo(t *testing.T) {
	t.Parallel()
	for _, copies := range []int{1, 2} {
		t.Run(fmt.Sprintf("%d copies", copies), func(t *testing.T) {
			t.Parallel()
			shareAsTheyComeAndGo(t, copies)
		})
	}
}

// shareAsTheyComeAndGo is TestInstancesShareThePartitionsAsTheyComeAndGo
// with copies instances a partition: two instances then serve every
// partition each, and one of them holds its seat.
func shareAsTheyComeAndGo(t *testing.T, copies int) {
	const partitions = 16
	s := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	run := func() (*instance.Instance, context.CancelFunc) {
		t.Helper()
		conn := natstest.Connect(t, s)
		inst, err := instance.Start(ctx, instance.Config{
			Service:         service.Config{Conn: conn, WatchConn: conn, Partitions: partitions, Logger: slog.New(slog.DiscardHandler)},
			PlansInterval:   10 * time.Millisecond,
			SharePartitions: true,
			ShareCopies:     copies,
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
	every := make([]int, partitions)
	for p := range every {
		every[p] = p
	}
	// shared checks that the instances serve every partition between
	// them, each as many times as it has copies, and hold the seat of
	// each, once, among those that serve it.
	shared := func(insts ...*instance.Instance) func() error {
		return func() error {
			var all, seats []int
			for _, inst := range insts {
				held, seated := inst.Service().Held(), inst.PartitionSeats()
				if slices.ContainsFunc(seated, func(p int) bool { return !slices.Contains(held, p) }) {
					return fmt.Errorf("an instance serves %v and holds the seats of %v", held, seated)
				}
				all, seats = append(all, held...), append(seats, seated...)
			}
			slices.Sort(all)
			slices.Sort(seats)
			var want []int
			for _, p := range every {
				for range min(copies, len(insts)) {
					want = append(want, p)
				}
			}
			if !slices.Equal(all, want) {
				return fmt.Errorf("the instances serve %v between them, want each of %v %d times", all, every, min(copies, len(insts)))
			}
			if !slices.Equal(seats, every) {
				return fmt.Errorf("the instances hold the seats of %v between them, want each of %v once", seats, every)
			}
			return nil
		}
	}

	first, _ := run()
	natstest.CheckFor(t, 10*time.Second, shared(first))

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
	var nodes []string // one of each partition
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

	// Asked all along, of either instance: every node's composition.
	asking, stopAsking := context.WithCancel(ctx)
	var asked, retry atomic.Int64
	var failures sync.Map
	var wg sync.WaitGroup
	operator := client.New(nc)
	wg.Go(func() {
		for asking.Err() == nil {
			for _, node := range nodes {
				plan, err := operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: node})
				switch {
				case wire.CodeOf(err) == wire.CodeUnavailable:
					// Retryable: one in flight at the instance
					// that stops.
					retry.Add(1)
				case err != nil:
					failures.Store("compose "+node+": "+err.Error(), true)
				case len(plan.GetPlans()) == 0:
					failures.Store("compose "+node+": no module planned", true)
				}
				asked.Add(1)
			}
		}
	})

	second, stopSecond := run()
	natstest.CheckFor(t, 20*time.Second, shared(first, second))
	natstest.CheckFor(t, 10*time.Second, func() error {
		if len(first.PartitionSeats()) == 0 || len(second.PartitionSeats()) == 0 {
			return fmt.Errorf("the seats are held as %v and %v: one holds none", first.PartitionSeats(), second.PartitionSeats())
		}
		return nil
	})
	written("api")

	stopSecond() // hands its partitions over before it stops
	natstest.CheckFor(t, 20*time.Second, shared(first))
	written("db")
	stopAsking()
	wg.Wait()
	failures.Range(func(failure, _ any) bool {
		t.Error(failure)
		return true
	})
	if asked.Load() < 10*partitions {
		t.Errorf("only %d compositions asked while the partitions moved", asked.Load())
	}
	if retry.Load() > 1 { // the one in flight as the second stopped
		t.Errorf("%d of %d compositions were 503s", retry.Load(), asked.Load())
	}
}

// Instances started together hear each other before they deal themselves a
// share: each starts with its own, not with every partition. Expecting
// their number (serve --hold-expect), each deals itself its share at the
// first round of discovery that heard them all, not after the rounds that
// wait for them without it.
func TestInstancesStartedTogetherStartWithTheirShares(t *testing.T) {
	t.Parallel()
	for _, expect := range []int{0, 2} {
		t.Run(fmt.Sprintf("expecting %d", expect), func(t *testing.T) {
			t.Parallel()
			startTogether(t, expect)
		})
	}
}

// startTogether is TestInstancesStartedTogetherStartWithTheirShares with
// Config.ShareExpect expect.
func startTogether(t *testing.T, expect int) {
	const partitions = 16
	s := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	insts := make([]*instance.Instance, 2)
	logs := make([]testlog.Buffer, len(insts))
	var wg sync.WaitGroup
	for i := range insts {
		wg.Go(func() {
			conn := natstest.Connect(t, s)
			inst, err := instance.Start(ctx, instance.Config{
				Service:         service.Config{Conn: conn, WatchConn: conn, Partitions: partitions, Logger: slog.New(slog.NewTextHandler(&logs[i], nil))},
				SharePartitions: true,
				ShareExpect:     expect,
			})
			if err != nil {
				t.Error(err)
				return
			}
			t.Cleanup(inst.Stop)
			insts[i] = inst
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	var all []int
	for i, inst := range insts {
		held := inst.Service().Held()
		if len(held) == 0 || len(held) == partitions {
			t.Errorf("an instance started with %d of %d partitions, want its share", len(held), partitions)
		}
		all = append(all, held...)
		// Without expecting, 3 rounds of 500 ms; expecting, rounds of
		// 100 ms until both are heard, 15 at most.
		rounds := regexp.MustCompile(`msg="sharing the partitions" members=2 .* rounds=(\d+)`).FindStringSubmatch(logs[i].String())
		switch {
		case rounds == nil:
			t.Errorf("instance %d did not log its first share among 2 members:\n%s", i, logs[i].String())
		case expect == 0 && rounds[1] != "3":
			t.Errorf("instance %d gathered the members over %s rounds of discovery, want 3", i, rounds[1])
		case expect > 0 && rounds[1] == "15":
			t.Errorf("instance %d expecting %d gathered the members over every one of its 15 rounds, want it to stop at the first that heard them", i, expect)
		}
	}
	slices.Sort(all)
	if len(all) != partitions || len(slices.Compact(all)) != partitions {
		t.Errorf("the two started with %v between them, want each partition once", all)
	}
}

// An instance of another number of partitions shares nothing with one that
// shares them: it is left out of the deal (each partition's index names
// other nodes in each), and the instance says so in its log.
func TestInstancesOfAnotherPartitionCountAreLeftOut(t *testing.T) {
	t.Parallel()
	const partitions = 16
	s := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// The stranger announces itself, and serves its partition 3 of 8.
	for _, metadata := range []map[string]string{
		{wire.MemberMetadata: "stranger", wire.PartitionsMetadata: "8"},
		{wire.MemberMetadata: "stranger", wire.PartitionsMetadata: "8", "partition": "3"},
	} {
		stranger, err := micro.AddService(natstest.Connect(t, s), micro.Config{Name: wire.ServiceName, Version: "0.0.1", Metadata: metadata})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = stranger.Stop() })
	}
	var logged testlog.Buffer
	conn := natstest.Connect(t, s)
	inst, err := instance.Start(ctx, instance.Config{
		Service:         service.Config{Conn: conn, WatchConn: conn, Partitions: partitions, Logger: slog.New(slog.NewTextHandler(&logged, nil))},
		SharePartitions: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	if held := inst.Service().Held(); len(held) != partitions {
		t.Errorf("beside an instance of 8 partitions, it starts with %v, want all %d of its own", held, partitions)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- inst.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	const warned = "share nothing with this one"
	natstest.CheckFor(t, 10*time.Second, func() error {
		if !strings.Contains(logged.String(), warned) {
			return fmt.Errorf("the log does not say %q yet", warned)
		}
		return nil
	})
	if n := strings.Count(logged.String(), warned); n != 1 {
		t.Errorf("the stranger is named %d times in the log, want once while it stays", n)
	}
}

//go:build faults

package faults_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// partitionSeats follows who holds each partition's seat from the
// instances' logs, beside the timeline's provisioner seat.
type partitionSeats struct {
	mu      sync.Mutex
	holder  map[int]string
	takenAt map[int]time.Time
	changed chan struct{}
}

func newPartitionSeats() *partitionSeats {
	return &partitionSeats{holder: map[int]string{}, takenAt: map[int]time.Time{}, changed: make(chan struct{})}
}

// line takes in one log line of name's.
func (ps *partitionSeats) line(name, msg string) {
	var p int
	ps.mu.Lock()
	defer ps.mu.Unlock()
	switch {
	case scan(msg, "took the seat of partition %d", &p):
		ps.holder[p], ps.takenAt[p] = name, time.Now()
	case scan(msg, "lost the seat of partition %d", &p), scan(msg, "handed the seat of partition %d back", &p):
		if ps.holder[p] == name {
			delete(ps.holder, p)
		}
	default:
		return
	}
	close(ps.changed)
	ps.changed = make(chan struct{})
}

// ended forgets what name held: it exited.
func (ps *partitionSeats) ended(name string) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	for p, h := range ps.holder {
		if h == name {
			delete(ps.holder, p)
		}
	}
	close(ps.changed)
	ps.changed = make(chan struct{})
}

// settled waits until each of n partitions' seats is held and none has
// changed hands for quiet, and reports whether that came within within.
func (ps *partitionSeats) settled(n int, quiet, within time.Duration) bool {
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		ps.mu.Lock()
		last, held := time.Time{}, len(ps.holder) == n
		for _, at := range ps.takenAt {
			if at.After(last) {
				last = at
			}
		}
		ps.mu.Unlock()
		if held && time.Since(last) >= quiet {
			return true
		}
		time.Sleep(100 * time.Millisecond) // polled: a quiet spell has no event
	}
	return false
}

// holders returns who holds each partition's seat.
func (ps *partitionSeats) holders() map[int]string {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	return maps.Clone(ps.holder)
}

func scan(msg, format string, p *int) bool {
	n, err := fmt.Sscanf(msg, format, p)
	return err == nil && n == 1
}

// waitHeld waits until partition p's seat is held, taken after since, and
// returns its holder, or "" after within.
func (ps *partitionSeats) waitHeld(p int, since time.Time, within time.Duration) string {
	deadline := time.After(within)
	for {
		ps.mu.Lock()
		h, at, changed := ps.holder[p], ps.takenAt[p], ps.changed
		ps.mu.Unlock()
		if h != "" && at.After(since) {
			return h
		}
		select {
		case <-changed:
		case <-deadline:
			return ""
		}
	}
}

// withMappings gives each server of a cluster the subject mappings of a
// mesh of n partitions.
func withMappings(n int) func(*server.Options) {
	return func(o *server.Options) {
		global := server.NewAccount(server.DEFAULT_GLOBAL_ACCOUNT)
		for _, m := range wire.PartitionMappings(n) {
			if err := global.AddMapping(m.Source, m.Destination); err != nil {
				panic(err)
			}
		}
		o.Accounts = append(o.Accounts, global)
	}
}

// TestFaultPartitionHolderLost runs three serve processes of a mesh of four
// partitions on a three-server cluster (R3 buckets): two serve partitions 0
// and 1, one of them holding their seats and the other standing by, and
// one serves 2 and 3. It kills the holder of partition 0's seat (SIGKILL:
// the standby, or the killed one started again, takes the seats once their
// leases run out), then does so
// again together with the registry stream's leader, which keeps the seats.
// Meanwhile every node is asked for its composition in a loop: no request
// may fail but with a 503, and once the writes stop every node's plan
// digest must be its composition's. It reports how long each partition's
// seat was vacant (issue 38 asks at most 5 s; its leases last 3 s, and an
// election of the registry stream's leader takes some 5 s here).
func TestFaultPartitionHolderLost(t *testing.T) {
	holderLost(t, nil, "0-1", "0-1", "2-3")
}

// TestFaultSharedPartitionHolderLost is TestFaultPartitionHolderLost with
// three instances that share the partitions (serve --hold auto): no
// standby, so the instances left deal the killed one's partitions among
// themselves once they take it for gone (three rounds, about 3 s), read
// them and serve them.
func TestFaultSharedPartitionHolderLost(t *testing.T) {
	holderLost(t, nil, "auto", "auto", "auto")
}

// TestFaultSharedPartitionCopyLost is TestFaultSharedPartitionHolderLost
// with two instances serving each partition (--hold-copies 2): the other
// copy answers on, and takes the seat once its lease runs out.
func TestFaultSharedPartitionCopyLost(t *testing.T) {
	holderLost(t, []string{"--hold-copies", "2"}, "auto", "auto", "auto")
}

// holderLost runs TestFaultPartitionHolderLost's scenarios with three serve
// processes, each given its --hold, and extra flags.
func holderLost(t *testing.T, extra []string, holds ...string) {
	bin := buildServe(t)
	const partitions = 4
	c := natstest.StartCluster(t, 3, withMappings(partitions))
	tl := newTimeline()
	seats := newPartitionSeats()
	tl.onLine = seats.line
	tl.onEnded = seats.ended
	var procs []*supervised
	for i, hold := range holds {
		args := append([]string{"serve", "--nats-url", c.URLs(i), "--replicas", "3", "--log-format", "json", "--log-level", "info",
			"--state-dir", t.TempDir(), "--partitions", fmt.Sprint(partitions), "--hold", hold}, extra...)
		procs = append(procs, supervise(t, bin, fmt.Sprintf("i%d", i), tl, args...))
	}
	names := make([]string, len(holds))
	for i := range holds {
		names[i] = fmt.Sprintf("i%d", i)
	}
	if !tl.waitServing(120*time.Second, names...) {
		t.Fatal("the instances do not all serve within 120s")
	}
	// Settled: shared partitions move once every instance serves.
	if !seats.settled(partitions, 3*time.Second, 60*time.Second) {
		t.Fatalf("the partitions' seats did not settle within 60s: %v", seats.holders())
	}
	admin := c.Connect(1)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	mesh := synth.Generate(synth.Config{Nodes: 12, Modules: 3, Needs: 4, Seed: 38})
	if err := mesh.Write(ctx, js, 4, nil); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range mesh.Nodes {
		nodes = append(nodes, n.Name)
	}
	plans, err := js.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	pc := &plansCheck{t: t, js: js, plans: plans, ask: client.New(c.Connect(0)), nodes: nodes}
	took := pc.consistent("start", time.Now())
	t.Logf("start: %d nodes written; every digest current %s after", len(nodes), took.Round(time.Millisecond))

	w := &needsWriter{nc: c.Connect(2), nodes: nodes}
	needsStream, registryStream := wire.StreamOf(keys.NeedsBucket), wire.StreamOf(keys.RegistryBucket)
	for _, fault := range []struct {
		name       string
		withLeader bool
	}{
		{"the holder of partition 0's seat killed", false},
		{"the holder of partition 0's seat killed with the registry stream's leader", true},
	} {
		asks := askAll(c, nodes)
		// A NATS server killed loses the requests in flight through it:
		// their askers time out, and ask again.
		stop := w.run()
		writesGoOn(t, js, needsStream, 50)
		holder := seats.waitHeld(0, time.Time{}, 30*time.Second)
		idx := int(holder[1] - '0')
		killed := time.Now()
		p := procs[idx]
		p.mu.Lock()
		if p.cmd != nil && p.cmd.Process != nil {
			p.stopping = true
			_ = p.cmd.Process.Kill()
		}
		p.mu.Unlock()
		leader := ""
		if fault.withLeader {
			leader = killLeader(t, c, js, registryStream)
		}
		taker := seats.waitHeld(0, killed, 60*time.Second)
		vacant := time.Since(killed)
		if taker == "" {
			t.Fatalf("%s: no instance took partition 0's seat within 60s", fault.name)
		}
		writesGoOn(t, js, needsStream, 50)
		stopped := time.Now()
		acked, failed := stop()
		took := pc.consistent(fault.name, stopped)
		answered, unavailable, timedOut, others := asks()
		t.Logf("%s: %s killed%s, %s took partition 0's seat %s later; %d needs written (%d failed); every digest current %s after the writes stopped; %d compositions answered, %d 503s, %d timed out, %d other failures",
			fault.name, holder, map[bool]string{true: " (" + leader + ")"}[leader != ""], taker, vacant.Round(time.Millisecond),
			acked, failed, took.Round(time.Millisecond), answered, unavailable, timedOut, len(others))
		// askAll has one request out at a time: the one the killed
		// instance held when killed, if any, is lost with it (its asker
		// times out). One handed on to it is handed on again (relayAgain).
		if timedOut > 1 && !fault.withLeader {
			t.Errorf("%s: %d requests timed out, with no NATS server killed (one may have been in the killed instance's hands)", fault.name, timedOut)
		}
		if len(others) > 0 {
			t.Errorf("%s: requests failed with other than a 503: %v", fault.name, others[:min(len(others), 5)])
		}
	}
}

// askAll asks every node's composition in a loop, an operator's request on
// server 0, until the returned function is called, which says how many
// were answered, how many were 503s and what else failed.
func askAll(c *natstest.Cluster, nodes []string) func() (answered, unavailable, timedOut int, others []error) {
	ask := client.New(c.Connect(0))
	ctx, cancel := context.WithCancel(context.Background())
	var n, u, late atomic.Int64
	var mu sync.Mutex
	var failures []error
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ctx.Err() == nil; i++ {
			reqCtx, cancelReq := context.WithTimeout(ctx, 5*time.Second)
			_, err := ask.Compose(reqCtx, &provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]})
			cancelReq()
			switch {
			case err == nil:
				n.Add(1)
			case ctx.Err() != nil:
			case wire.CodeOf(err) == wire.CodeUnavailable, errors.Is(err, nats.ErrNoResponders):
				// Both are 503s: the service's, or nats-server's
				// when no instance is subscribed at the moment (one
				// reconnecting from the server killed).
				u.Add(1)
			case errors.Is(err, context.DeadlineExceeded):
				late.Add(1)
			default:
				mu.Lock()
				failures = append(failures, fmt.Errorf("%s: %w", nodes[i%len(nodes)], err))
				mu.Unlock()
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	return func() (int, int, int, []error) {
		cancel()
		wg.Wait()
		return int(n.Load()), int(u.Load()), int(late.Load()), failures
	}
}

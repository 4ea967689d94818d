//go:build faults

package faults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// plansQuiet bounds how long after the writes stop every node's digest
// must be its composition's.
const plansQuiet = 60 * time.Second

// TestFaultPlansDigests runs three serve processes under supervisors on a
// three-server cluster (R3 buckets), a small mesh, and a writer putting
// needs to its nodes throughout; it restarts the seat holder's NATS server,
// kills the plans stream's leader, and stops the seat's holder (a standby
// takes the seat). After each fault, once the writes stop, every node's
// key in mesh-provisioner_plans must hold the plan_digest of its
// composition asked now, at the needs' last revision: no change was
// missed. It prints how long each took to be consistent.
func TestFaultPlansDigests(t *testing.T) {
	bin := buildServe(t)
	c := natstest.StartCluster(t, 3)
	tl := newTimeline()
	var procs []*supervised
	for i := range 3 {
		procs = append(procs, supervise(t, bin, fmt.Sprintf("i%d", i), tl,
			"serve", "--nats-url", c.URLs(i), "--replicas", "3", "--log-format", "json", "--log-level", "info",
			"--state-dir", t.TempDir()))
	}
	natstest.CheckFor(t, 60*time.Second, func() error {
		if tl.current() == "" {
			return errors.New("no instance holds the seat")
		}
		return nil
	})
	admin := c.Connect(1)
	js, err := jetstream.New(admin)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	natstest.CheckFor(t, 30*time.Second, func() error {
		_, err := js.KeyValue(ctx, keys.PlansBucket)
		return err
	})
	mesh := synth.Generate(synth.Config{Nodes: 12, Modules: 3, Needs: 4, Seed: 22})
	if err := mesh.Write(ctx, js, 4, nil); err != nil {
		t.Fatal(err)
	}
	var nodes []string
	for _, n := range mesh.Nodes {
		nodes = append(nodes, n.Name)
	}
	pc := &plansCheck{t: t, js: js, ask: client.New(c.Connect(0)), nodes: nodes}
	plans, err := js.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	pc.plans = plans
	took := pc.consistent("start", time.Now())
	t.Logf("start: %d nodes written; every digest current %s after", len(nodes), took.Round(time.Millisecond))

	w := &needsWriter{nc: c.Connect(2), nodes: nodes}
	plansStream, needsStream := wire.StreamOf(keys.PlansBucket), wire.StreamOf(keys.NeedsBucket)
	for _, fault := range []struct {
		name string
		do   func(t *testing.T) string
	}{
		{"NATS restart (the seat holder's server)", func(t *testing.T) string {
			holder := tl.current()
			server := int(holder[1] - '0') // instance iK joins server K first
			c.Restart(server, 2*time.Second)
			c.WaitMetaLeader(30 * time.Second)
			c.WaitStreamLeader(plansStream, 30*time.Second)
			return fmt.Sprintf("server s%d (%s's) down 2s", server, holder)
		}},
		{"plans stream leader killed", func(t *testing.T) string { return killLeader(t, c, js, plansStream) }},
		{"needs stream leader killed", func(t *testing.T) string { return killLeader(t, c, js, needsStream) }},
		{"seat takeover (holder stopped)", func(t *testing.T) string { return takeOver(t, tl, procs, false) }},
		{"seat takeover (holder killed: the lease expires)", func(t *testing.T) string { return takeOver(t, tl, procs, true) }},
	} {
		stop := w.run()
		writesGoOn(t, js, needsStream, 50) // writes before the fault
		what := fault.do(t)
		writesGoOn(t, js, needsStream, 50) // writes after it
		stopped := time.Now()
		acked, failed := stop()
		took := pc.consistent(fault.name, stopped)
		t.Logf("%s: %s; %d needs written during it (%d failed); every digest current %s after the writes stopped",
			fault.name, what, acked, failed, took.Round(time.Millisecond))
	}
	var exits []string
	for _, p := range procs {
		for _, e := range p.unaskedExits() {
			if e != killedExit {
				exits = append(exits, p.name+": "+e)
			}
		}
	}
	if len(exits) > 0 {
		t.Errorf("instances ended themselves: %v", exits)
	}
}

// killedExit is how supervised records the exit of a process takeOver
// killed.
const killedExit = "signal: killed (asked: true)"

// takeOver stops the seat's holder (SIGTERM: it hands the seat back), or
// kills it (SIGKILL: a standby takes the seat once the lease expires), and
// waits until a standby takes the seat; the supervisor starts it again.
func takeOver(t *testing.T, tl *timeline, procs []*supervised, kill bool) string {
	t.Helper()
	holder := tl.current()
	for len(tl.took) > 0 {
		<-tl.took
	}
	idx := slices.IndexFunc(procs, func(p *supervised) bool { return p.name == holder })
	if idx < 0 {
		t.Fatal("no instance holds the seat")
	}
	stopped := time.Now()
	how := "stopped"
	if kill {
		how = "killed"
		p := procs[idx]
		p.mu.Lock()
		if p.cmd != nil && p.cmd.Process != nil {
			p.stopping = true
			_ = p.cmd.Process.Kill()
		}
		p.mu.Unlock()
	} else {
		procs[idx].term()
	}
	var taker string
	select {
	case taker = <-tl.took:
	case <-time.After(60 * time.Second):
		t.Fatalf("no standby took the seat within 60s of %s's %s", holder, how)
	}
	return fmt.Sprintf("%s %s, %s took the seat %s later", holder, how, taker, time.Since(stopped).Round(time.Millisecond))
}

// killLeader kills stream's leader, lets the writes go on under the next
// one (20 of them: the needs writer's, or the plans writer's digests), and
// starts the server again.
func killLeader(t *testing.T, c *natstest.Cluster, js jetstream.JetStream, stream string) string {
	t.Helper()
	leader := c.WaitStreamLeader(stream, 10*time.Second)
	c.Kill(leader)
	lost := time.Now()
	next := c.WaitStreamLeader(stream, 30*time.Second)
	elected := time.Since(lost)
	writesGoOn(t, js, stream, 20)
	c.Start(leader)
	c.WaitMetaLeader(30 * time.Second)
	c.WaitStreamLeader(stream, 30*time.Second)
	return fmt.Sprintf("s%d killed, s%d led after %s", leader, next, elected.Round(time.Millisecond))
}

// writesGoOn waits until stream has taken n writes more than it had when
// called, and fails the test if it has not within a minute.
func writesGoOn(t *testing.T, js jetstream.JetStream, stream string, n uint64) {
	t.Helper()
	last := func() (uint64, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return 0, err
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, err
		}
		return info.State.LastSeq, nil
	}
	var from uint64
	natstest.CheckFor(t, 30*time.Second, func() (err error) {
		from, err = last()
		return err
	})
	natstest.CheckFor(t, time.Minute, func() error {
		seq, err := last()
		if err != nil {
			return err
		}
		if seq < from+n {
			return fmt.Errorf("%s took %d writes, want %d", stream, seq-from, n)
		}
		return nil
	})
}

// needsWriter puts needs to random nodes, one every 10ms, and then writes
// some of them again with a changed value, so that plans change both ways.
type needsWriter struct {
	nc    *nats.Conn
	nodes []string
	round int
}

// run writes until stop is called; stop returns how many writes were
// acked and how many failed.
func (w *needsWriter) run() (stop func() (int, int)) {
	w.round++
	ctx, cancel := context.WithCancel(context.Background())
	var acked, failed int
	var wg sync.WaitGroup
	wg.Go(func() {
		js, err := jetstream.New(w.nc)
		if err != nil {
			failed++
			return
		}
		kv, err := js.KeyValue(ctx, keys.NeedsBucket)
		if err != nil {
			failed++
			return
		}
		rng := rand.New(rand.NewPCG(uint64(w.round), 22))
		for i := 0; ctx.Err() == nil; i++ {
			node := w.nodes[rng.IntN(len(w.nodes))]
			name := fmt.Sprintf("f%d", rng.IntN(40))
			key, _ := keys.NeedKey{Node: node, Module: "faults", Kind: "port", Name: name}.Key()
			value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:" + name + "}", Required: i%2 == 0})
			put, cancelPut := context.WithTimeout(ctx, 2*time.Second)
			if _, err := kv.Put(put, key, value); err != nil {
				failed++
			} else {
				acked++
			}
			cancelPut()
			select {
			case <-ctx.Done():
			case <-time.After(10 * time.Millisecond):
			}
		}
	})
	return func() (int, int) {
		cancel()
		wg.Wait()
		return acked, failed
	}
}

// plansCheck compares the plans bucket with compositions.
type plansCheck struct {
	t     *testing.T
	js    jetstream.JetStream
	plans jetstream.KeyValue
	ask   *client.Client
	nodes []string
}

// consistent waits, at most plansQuiet, until every node's digest is its
// composition's, and returns how long after from it was.
func (pc *plansCheck) consistent(phase string, from time.Time) time.Duration {
	pc.t.Helper()
	var first, last error
	checks := 0
	natstest.CheckFor(pc.t, plansQuiet, func() error {
		checks++
		if err := pc.check(); err != nil {
			last = fmt.Errorf("%s: %w", phase, err)
			if first == nil {
				first = last
			}
			return last
		}
		return nil
	})
	took := time.Since(from)
	if took > 2*time.Second {
		// Slow to agree: say what the checks found meanwhile.
		pc.t.Logf("%s: the digests agreed after %d checks; the first found: %v; the last: %v", phase, checks, first, last)
	}
	return took
}

// check composes every node at the needs stream's last revision, and
// compares its digest with the node's key in the plans bucket.
func (pc *plansCheck) check() error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	stream, err := pc.js.Stream(ctx, wire.StreamOf(keys.NeedsBucket))
	if err != nil {
		return err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err
	}
	var wrong []string
	for _, node := range pc.nodes {
		composition, err := pc.ask.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: node,
			MinRevisions: &provisionerv1.Revisions{Needs: info.State.LastSeq}})
		if err != nil {
			return fmt.Errorf("compose %s: %w", node, err)
		}
		e, err := pc.plans.Get(ctx, node)
		if err != nil {
			return fmt.Errorf("plans key %s: %w", node, err)
		}
		held := &provisionerv1.PlanDigest{}
		if err := proto.Unmarshal(e.Value(), held); err != nil {
			return fmt.Errorf("plans key %s: %w", node, err)
		}
		if held.GetDigest() != composition.GetPlanDigest() {
			wrong = append(wrong, fmt.Sprintf("%s holds %s (needs revision %d), its composition at needs revision %d is %s",
				node, short(held.GetDigest()), held.GetRevisions().GetNeeds(), composition.GetRevisions().GetNeeds(), short(composition.GetPlanDigest())))
		}
	}
	if len(wrong) > 0 {
		return fmt.Errorf("%d of %d digests not current: %s", len(wrong), len(pc.nodes), strings.Join(wrong, "; "))
	}
	return nil
}

func short(digest string) string {
	if len(digest) > 19 {
		return digest[:19]
	}
	return digest
}

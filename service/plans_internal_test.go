package service

import (
	"context"
	"fmt"
	"math"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/meshtest"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service/plans"
)

// startOnMesh writes a synthetic mesh into an embedded server's buckets,
// with the registry's table, and starts a service on it, ready.
func startOnMesh(t testing.TB, meshConfig synth.Config, cfg Config) (*Service, *synth.Mesh, *nats.Conn) {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	return startOnMeshAs(t, nc, nc, meshConfig, cfg)
}

// startOnMeshDenying is startOnMesh on a server that denies the service's
// identity (user "svc") the subjects in deny; the connection returned is
// the admin's, which may do anything.
func startOnMeshDenying(t testing.TB, deny []string, meshConfig synth.Config, cfg Config) (*Service, *synth.Mesh, *nats.Conn) {
	t.Helper()
	s := natstest.StartDenying(t, "svc", deny...)
	admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	svc := natstest.Connect(t, s, nats.UserInfo("svc", "svc"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	return startOnMeshAs(t, admin, svc, meshConfig, cfg)
}

// startOnMeshAs writes the registry and the mesh through admin, and starts
// the service on svc once its copy is whole.
func startOnMeshAs(t testing.TB, admin, svc *nats.Conn, meshConfig synth.Config, cfg Config) (*Service, *synth.Mesh, *nats.Conn) {
	t.Helper()
	mesh := meshtest.Write(t, admin, meshConfig)
	ctx := context.Background()
	cfg.Conn = svc
	s, err := Start(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	wctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := s.WaitReady(wctx); err != nil {
		t.Fatal(err)
	}
	return s, mesh, admin
}

// A node that rewrites its records without pause has about a share of a
// core spent on its compositions by the plans' writer (plans.Share), not a
// core: its composition is put off, not lost, and another node's change is
// written meanwhile.
func TestANodeRewritingItsRecordsIsComposedLessOften(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 2, Modules: 30, Needs: 40}, Config{})
	kv := bucketsOn(t, nc)
	plansKV, needs := kv(keys.PlansBucket), kv(keys.NeedsBucket)
	churner, other := mesh.Nodes[0].Name, mesh.Nodes[1].Name
	// What one composition of the churner costs: the least of a few, as
	// the writer counts it, here and again after the churn (a loaded
	// machine's times vary).
	cost := time.Duration(math.MaxInt64)
	var records int
	measure := func() {
		for range 10 {
			start := time.Now()
			records = plans.Compose(s.mirror, churner).Records
			cost = min(cost, time.Since(start))
		}
	}
	measure()
	const interval = time.Millisecond
	if (plans.Share-1)*cost <= plans.Settle {
		t.Fatalf("%s (%d records) composes in %s: too little to be put off", churner, records, cost)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = s.RunPlans(runCtx, PlansConfig{KV: plansKV, Interval: interval}) }()
	// digestAt returns node's digest once the writer has written it at
	// needs revision rev or later.
	digestAt := func(node string, rev uint64) string {
		t.Helper()
		var digest string
		natstest.CheckFor(t, 10*time.Second, func() error {
			e, err := plansKV.Get(ctx, node)
			if err != nil {
				return err
			}
			d := &provisionerv1.PlanDigest{}
			if err := proto.Unmarshal(e.Value(), d); err != nil {
				return err
			}
			if d.GetRevisions().GetNeeds() < rev {
				return fmt.Errorf("%s's digest at needs revision %d, want %d", node, d.GetRevisions().GetNeeds(), rev)
			}
			digest = d.GetDigest()
			return nil
		})
		return digest
	}
	put := func(node string, n int) uint64 {
		t.Helper()
		value, err := proto.Marshal(&provisionerv1.Need{Placeholder: fmt.Sprintf("${port:churn%d}", n)})
		if err != nil {
			t.Fatal(err)
		}
		rev, err := needs.Put(ctx, node+".web.port.churn", value)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	digestAt(churner, 0)
	digestAt(other, 0)

	// The churner writes a need that changes its plan, without pause, for
	// a second; halfway, the other node writes one.
	composed, start := s.plans.Composed.Load(), time.Now()
	var last uint64
	otherWritten := false
	for n := 0; time.Since(start) < time.Second; n++ {
		last = put(churner, n)
		if !otherWritten && time.Since(start) > time.Second/2 {
			otherWritten = true
			rev, asked := put(other, 0), time.Now()
			digestAt(other, rev)
			t.Logf("the other node's change written in %s", time.Since(asked))
		}
	}
	elapsed := time.Since(start)
	times := int(s.plans.Composed.Load() - composed - 1) // the other node once
	// Its last change is not lost: its digest comes to be its
	// composition's. (A digest's revisions are read after composing, so
	// one at revision last may be of the write before, its next put off.)
	wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if !s.mirror.Needs.WaitFor(wctx, last) {
		t.Fatalf("the copy did not reach revision %d", last)
	}
	// The digest the node's compose answer carries
	// (TestComposeForPlansDigestsAsTheAnswer, in the answers room).
	want := plans.Compose(s.mirror, churner).Digest
	natstest.CheckFor(t, 10*time.Second, func() error {
		if got := digestAt(churner, last); got != want {
			return fmt.Errorf("%s's digest %s after its last change, its composition's %s", churner, got, want)
		}
		return nil
	})

	measure() // the writer idle: its last change written
	share := float64(times) * float64(cost) / float64(elapsed)
	t.Logf("%s (%d records, %s a composition) composed %d times in %s: %.2f of a core",
		churner, records, cost, times, elapsed.Round(time.Millisecond), share)
	if most := 1.5 / plans.Share; share > most {
		t.Errorf("%s's compositions took %.2f of a core, want at most %.2f", churner, share, most)
	}
}

// A provider's key of a node, in a bucket the node's composition does not
// read, composes nothing: a provider writing keys of every node costs the
// plans' writer compositions of its own consumers only.
func TestAProvidersKeyComposesOnlyItsConsumers(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 8, Modules: 4, Needs: 6, Bound: 50}, Config{})
	kv := bucketsOn(t, nc)
	// Every bucket the nodes name is read first, as in
	// TestComposeForPlansDigestsAsTheAnswer: one read later changes every
	// node with a key in it.
	compose := s.answers.Compose()
	for _, n := range mesh.Nodes {
		if werr := s.answers.WaitRevisions(compose.Pending(&provisionerv1.ComposeRequest{Node: n.Name})); werr != nil {
			t.Fatal(werr)
		}
	}
	// A node, a bucket its composition reads, and one another node's
	// reads and it does not (the copy follows only buckets named).
	var node, reads, other string
	read := map[string][]string{}
	for _, n := range mesh.Nodes {
		read[n.Name] = plans.Compose(s.mirror, n.Name).Buckets
	}
	for _, n := range mesh.Nodes {
		for _, m := range mesh.Nodes {
			for _, b := range read[m.Name] {
				if len(read[n.Name]) > 0 && !slices.Contains(read[n.Name], b) {
					node, reads, other = n.Name, read[n.Name][0], b
				}
			}
		}
	}
	if node == "" {
		t.Fatalf("no node of the mesh reads fewer buckets than another: %v", read)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	go func() { _ = s.RunPlans(runCtx, PlansConfig{KV: kv(keys.PlansBucket), Interval: time.Millisecond}) }()
	natstest.CheckFor(t, 10*time.Second, func() error {
		if s.plans.Written.Load() < uint64(len(mesh.Nodes)) {
			return fmt.Errorf("the first pass wrote %d digests of %d", s.plans.Written.Load(), len(mesh.Nodes))
		}
		return nil
	})
	// write puts a key of node in bucket and waits for the copy to hold it.
	write := func(bucket, key string) {
		t.Helper()
		rev, err := kv(bucket).Put(ctx, key, []byte("bound"))
		if err != nil {
			t.Fatal(err)
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if !s.mirror.Bound.Bucket(bucket).WaitFor(wctx, rev) {
			t.Fatalf("the copy of %s did not reach revision %d", bucket, rev)
		}
	}

	composed := s.plans.Composed.Load()
	for i := range 20 {
		write(other, fmt.Sprintf("%s.m.p%d", node, i))
	}
	// A quiet window of a hundred intervals: that nothing is composed is
	// what is checked, so it is waited out, not polled for.
	time.Sleep(100 * time.Millisecond) // a quiet window, not a wait for a condition
	if n := s.plans.Composed.Load() - composed; n != 0 {
		t.Errorf("20 keys of %s in %s, a bucket it does not read: %d compositions, want none", node, other, n)
	}
	composed = s.plans.Composed.Load()
	write(reads, node+".m.p")
	natstest.CheckFor(t, 10*time.Second, func() error {
		if s.plans.Composed.Load() == composed {
			return fmt.Errorf("a key of %s in %s, a bucket it reads: not composed", node, reads)
		}
		return nil
	})
}

// bucketsOn returns what binds a bucket on nc, failing t if it cannot.
func bucketsOn(t *testing.T, nc *nats.Conn) func(bucket string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return func(bucket string) jetstream.KeyValue {
		t.Helper()
		b, err := js.KeyValue(t.Context(), bucket)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

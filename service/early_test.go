package service_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// loadingMesh is a mesh whose service never loads its copy of the needs:
// its identity may not pull from the consumer that reads the whole bucket
// (nats-server refuses it), and may watch one node's keys. It answers as
// a lone instance does while it loads.
type loadingMesh struct {
	server  *server.Server
	admin   *nats.Conn
	js      jetstream.JetStream
	mesh    *synth.Mesh
	service *service.Service
}

func newLoadingMesh(t *testing.T, layout buckets.Config, meshConfig synth.Config, write func(js jetstream.JetStream), cfg service.Config) *loadingMesh {
	t.Helper()
	pullWhole := "$JS.API.CONSUMER.MSG.NEXT." + wire.StreamOf(keys.NeedsBucket) + ".>"
	return newMeshDenying(t, layout, []string{pullWhole}, meshConfig, write, cfg)
}

// newMeshDenying is a mesh, its buckets made with layout, whose service's
// identity is denied deny.
func newMeshDenying(t *testing.T, layout buckets.Config, deny []string, meshConfig synth.Config, write func(js jetstream.JetStream), cfg service.Config) *loadingMesh {
	t.Helper()
	s := natstest.StartDenying(t, "svc", deny...)
	m := &loadingMesh{server: s, admin: natstest.Connect(t, s, nats.UserInfo("admin", "admin"))}
	ctx := t.Context()
	var err error
	if m.js, err = jetstream.New(m.admin); err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, m.js, layout); err != nil {
		t.Fatal(err)
	}
	kv, err := m.js.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Reconcile(ctx, kv, registry.Table()); err != nil {
		t.Fatal(err)
	}
	m.mesh = synth.Generate(meshConfig)
	if err := m.mesh.Write(ctx, m.js, 4, nil); err != nil {
		t.Fatal(err)
	}
	if write != nil {
		write(m.js)
	}
	cfg.Conn = natstest.Connect(t, s, nats.UserInfo("svc", "svc"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if m.service, err = service.Start(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(m.service.Stop)
	return m
}

// stillLoading fails the test unless the service's copy of the needs is
// still loading: what it answered, it answered early.
func (m *loadingMesh) stillLoading(t *testing.T) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := m.service.WaitReady(ctx); err == nil {
		t.Fatal("the copy loaded: the test asks a loading copy")
	}
}

// TestVerbsWhileLoadingAnswerAsTheCopy asks a loading instance for every
// node's composition, in binary and JSON, and its own records, and the
// registry and manifests: each answer is the one a replay of the buckets
// gives at the same revisions, for nodes with malformed keys, a key that
// is the node's name alone, a provider with no bucket, and no keys at all.
func TestVerbsWhileLoadingAnswerAsTheCopy(t *testing.T) {
	t.Parallel()
	for _, layout := range []buckets.Config{{}, {Partitions: 8}} {
		t.Run(fmt.Sprintf("stored by %d partitions", layout.Partitions), func(t *testing.T) {
			t.Parallel()
			verbsWhileLoadingAnswerAsTheCopy(t, layout)
		})
	}
}

// verbsWhileLoadingAnswerAsTheCopy is TestVerbsWhileLoadingAnswerAsTheCopy
// on buckets made with layout.
func verbsWhileLoadingAnswerAsTheCopy(t *testing.T, layout buckets.Config) {
	need := func(provider string) []byte {
		return encode(t, &provisionerv1.Need{Provider: provider, Provision: "db9"})
	}
	m := newLoadingMesh(t, layout, synth.Config{Nodes: 4, Modules: 6, Needs: 5, Builds: 50, Bound: 50}, func(js jetstream.JetStream) {
		needs, _ := js.KeyValue(t.Context(), keys.NeedsBucket)
		put(t, needs, "odd.web.bound.ok", need("pg"))
		put(t, needs, "odd.web.bound.garbled", []byte{0xff, 0xff}) // malformed
		put(t, needs, "odd", need("pg"))                           // malformed: the node's name alone
		put(t, needs, "ghost.web.bound.db", need("ghost"))         // a provider with no bucket
	}, service.Config{})
	// A replay composes at the captured revisions as the copy does.
	capture, err := mirror.Capture(t.Context(), m.js)
	if err != nil {
		t.Fatal(err)
	}
	replay, err := answers.NewReplay(capture)
	if err != nil {
		t.Fatal(err)
	}
	nodes := []string{"odd", "ghost", "nobody"}
	for _, n := range m.mesh.Nodes {
		nodes = append(nodes, n.Name)
	}
	for _, node := range nodes {
		want, err := replay.Compose(&provisionerv1.ComposeRequest{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		for _, contentType := range []string{wire.ContentTypeProtobuf, wire.ContentTypeJSON} {
			body := encode(t, &provisionerv1.ComposeRequest{Node: node})
			if contentType == wire.ContentTypeJSON {
				body = []byte(fmt.Sprintf(`{"node":%q}`, node))
			}
			got := &provisionerv1.ComposeResponse{}
			if err := decodeAnswer(rawTo(t, m.admin, wire.ComposeSubject, contentType, body), got); err != nil {
				t.Fatalf("compose %s while loading, in %s: %v", node, contentType, err)
			}
			if diff := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")); diff != "" {
				t.Errorf("compose %s while loading, in %s, differs from the copy's at the same revisions (-copy +early):\n%s", node, contentType, diff)
			}
		}
	}
	ask := client.New(m.admin)
	provisioning := []*provisionerv1.ProvisioningRequest{{What: provisionerv1.What_WHAT_REGISTRY}, {What: provisionerv1.What_WHAT_MANIFESTS}}
	for _, node := range nodes {
		for _, what := range []provisionerv1.What{provisionerv1.What_WHAT_NEEDS, provisionerv1.What_WHAT_APPLIED, provisionerv1.What_WHAT_COLLECT} {
			provisioning = append(provisioning, &provisionerv1.ProvisioningRequest{What: what, Node: node})
		}
	}
	asked := map[string]uint64{wire.ComposeEndpoint: uint64(2 * len(nodes)), wire.ProvisioningEndpoint: uint64(len(provisioning))}
	for _, req := range provisioning {
		want, err := replay.Provisioning(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := ask.Provisioning(t.Context(), req)
		if err != nil {
			t.Fatalf("provisioning %v while loading: %v", req, err)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("provisioning %v while loading differs from the copy's at the same revision (-copy +early):\n%s", req, diff)
		}
	}
	// The stats count them apart, each endpoint its own.
	for _, e := range m.service.Stats().Endpoints {
		data, err := wire.DecodeStatsData(e.Data)
		if err != nil {
			t.Fatal(err)
		}
		if data.GetAnsweredEarly() != asked[e.Name] || data.GetAnswered() < asked[e.Name] {
			t.Errorf("%s's stats: %d answered, %d early; want %d early", e.Name, data.GetAnswered(), data.GetAnsweredEarly(), asked[e.Name])
		}
	}
	m.stillLoading(t)
}

// A request that comes while the copy loads, and waits for the registry's
// copy (which a read of its node alone needs), is answered as the whole
// copy answers it if the copy came whole meanwhile, not read alone: the
// registry's copy is the last to load, once nats-server lets the
// service's identity make its consumer. The node is over its budget:
// read alone, it would get a 503.
func TestARequestTheCopyCameWholeForIsTheCopys(t *testing.T) {
	t.Parallel()
	registryConsumer := "$JS.API.CONSUMER.CREATE." + wire.StreamOf(keys.RegistryBucket)
	registryRead := "$JS.API.DIRECT.GET." + wire.StreamOf(keys.RegistryBucket) // its first read, in one batch
	m := newMeshDenying(t, buckets.Config{}, []string{registryConsumer, registryConsumer + ".>", registryRead}, synth.Config{Nodes: 1, Modules: 3, Needs: 4}, func(js jetstream.JetStream) {
		needs, _ := js.KeyValue(t.Context(), keys.NeedsBucket)
		for i := range 40 {
			put(t, needs, fmt.Sprintf("big.web.port.p%d", i), encode(t, &provisionerv1.Need{}))
		}
	}, service.Config{RevisionWait: 30 * time.Second, NodeMaxKeys: 35})
	// The large buckets load without the registry's copy, a second on
	// (provisions, never answered early, says what is still loading).
	natstest.CheckFor(t, 10*time.Second, func() error {
		_, err := client.New(m.admin).Provisions(t.Context(), &provisionerv1.ProvisionsRequest{Provider: "pg"})
		if !strings.Contains(fmt.Sprint(err), "loading its copy of "+keys.RegistryBucket+";") {
			return fmt.Errorf("provisions: %w; want a 503 naming the registry's copy alone", err)
		}
		return nil
	})
	const node = "big"
	answered := make(chan *provisionerv1.ComposeResponse, 1)
	go func() {
		out, err := client.New(m.admin).Compose(t.Context(), &provisionerv1.ComposeRequest{Node: node})
		if err != nil {
			t.Errorf("compose %s: %v", node, err)
		}
		answered <- out
	}()
	natstest.CheckFor(t, 5*time.Second, func() error {
		for _, e := range m.service.Stats().Endpoints {
			if e.Name == wire.ComposeEndpoint && e.NumRequests > 0 {
				return nil
			}
		}
		return errors.New("the compose request has not come")
	})
	natstest.ReloadDenying(t, m.server, "svc")
	got := <-answered
	// The whole copy holds 35 of its 40 keys, and refuses the others.
	if n := len(got.GetRefusals()); n != 5 || !strings.Contains(got.GetRefusals()[0].GetDetail(), "not held") {
		t.Errorf("compose %s: %d refusals (%v), want the 5 keys over its budget", node, n, got.GetRefusals())
	}
	for _, e := range m.service.Stats().Endpoints {
		data, err := wire.DecodeStatsData(e.Data)
		if err != nil {
			t.Fatal(err)
		}
		if e.Name == wire.ComposeEndpoint && data.GetAnsweredEarly() != 0 {
			t.Errorf("compose answered %d early, want none: the copy was whole when it answered", data.GetAnsweredEarly())
		}
	}
}

// TestVerbsWhileLoadingRefuseWhatTheyCannotReadAlone: a loading instance
// answers 503, saying why, a node over its budget, a revision after what
// it read, and every node's records; and a node whose needs name more
// providers' buckets than it waits for, not read yet, until the copy has
// looked for them.
func TestVerbsWhileLoadingRefuseWhatTheyCannotReadAlone(t *testing.T) {
	t.Parallel()
	m := newLoadingMesh(t, buckets.Config{}, synth.Config{Nodes: 1, Modules: 2, Needs: 2}, func(js jetstream.JetStream) {
		needs, _ := js.KeyValue(t.Context(), keys.NeedsBucket)
		for i := range 20 { // more providers' buckets than a read alone waits for
			put(t, needs, fmt.Sprintf("wide.web.bound.b%d", i), encode(t, &provisionerv1.Need{Provider: fmt.Sprintf("p%d", i), Provision: "db"}))
		}
		for i := range 40 { // over its budget
			put(t, needs, fmt.Sprintf("big.web.port.p%d", i), encode(t, &provisionerv1.Need{}))
		}
	}, service.Config{NodeMaxKeys: 35})
	ask := client.New(m.admin)
	for _, tc := range []struct {
		name string
		req  *provisionerv1.ComposeRequest
		want string
	}{
		// Of the 20 it names, those not read when it counts: a look that
		// finds a bucket missing may end while it names the next.
		{"too many providers' buckets not read yet", &provisionerv1.ComposeRequest{Node: "wide"}, "providers' buckets it has not read yet, more than the 16 a read alone waits for"},
		{"over its budget", &provisionerv1.ComposeRequest{Node: "big"}, "the node is over its budget in mesh-provisioner_needs"},
		{"a revision after the read", &provisionerv1.ComposeRequest{Node: m.mesh.Nodes[0].Name, MinRevisions: &provisionerv1.Revisions{Needs: 1 << 40}}, "behind the 1099511627776 asked for"},
	} {
		_, err := ask.Compose(t.Context(), tc.req)
		checkStillLoading(t, "compose: "+tc.name, err, tc.want)
	}
	// Named by that request, its buckets are looked for, found missing:
	// asked again, it is answered, its provisions pending.
	natstest.CheckFor(t, 10*time.Second, func() error {
		out, err := ask.Compose(t.Context(), &provisionerv1.ComposeRequest{Node: "wide"})
		if err != nil {
			return err
		}
		if n := len(out.GetProvisions()); n != 20 {
			return fmt.Errorf("wide's composition holds %d provisions, want 20", n)
		}
		return nil
	})
	for _, tc := range []struct {
		name string
		req  *provisionerv1.ProvisioningRequest
		want string
	}{
		{"every node's needs", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS}, "ask again shortly"},
		{"over its budget", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "big"}, "the node is over its budget in mesh-provisioner_needs"},
		{"a revision after the read", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: m.mesh.Nodes[0].Name, MinRevision: 1 << 40}, "behind the 1099511627776 asked for"},
	} {
		_, err := ask.Provisioning(t.Context(), tc.req)
		checkStillLoading(t, "provisioning: "+tc.name, err, tc.want)
	}
	m.stillLoading(t)
}

// Reads of a node alone are bounded across every node (a rate, after a
// burst of as many): many requests at once, while the copy loads, get that
// many answers, and the others a 503 that says so. The test's bound, 10 a
// second, is under what any machine reads (a -race run on 2 busy cores
// reads some 100 a second, the default bound, which it could not see), and
// no request is shed for its wait in the queue, which is not this bound.
// The requests name 10 nodes, whose bounds of their own (earlyReadsPerNode
// each) add up to more than the mesh's: the mesh's is what they meet.
func TestReadsAloneAreBounded(t *testing.T) {
	t.Parallel()
	const perSecond, asked, nodes = 10, 200, 10
	cfg := service.Config{MaxQueueWait: time.Minute}
	cfg.SetEarlyReadsPerSecond(perSecond)
	m := newLoadingMesh(t, buckets.Config{}, synth.Config{Nodes: nodes, Modules: 2, Needs: 2}, nil, cfg)
	var answered, bounded atomic.Int64
	var asking sync.WaitGroup
	start := time.Now()
	for i := range asked {
		asking.Go(func() {
			_, err := client.New(m.admin).Compose(t.Context(), &provisionerv1.ComposeRequest{Node: m.mesh.Nodes[i%nodes].Name})
			var werr *wire.Error
			switch {
			case err == nil:
				answered.Add(1)
			case errors.As(err, &werr) && strings.Contains(werr.Sentence(), fmt.Sprintf("reads at most %d nodes alone a second", perSecond)):
				bounded.Add(1)
			case errors.As(err, &werr) && strings.Contains(werr.Sentence(), "alone at most"):
				// The node's own bound, met before the mesh's.
			default:
				t.Errorf("compose while loading: %v", err)
			}
		})
	}
	asking.Wait()
	took := time.Since(start)
	most := perSecond + int64(perSecond*took.Seconds()) + 1
	if answered.Load() > most || bounded.Load() == 0 {
		t.Errorf("%d of %d requests answered and %d refused for the bound in %s; want at most %d answered and some refused", answered.Load(), asked, bounded.Load(), took, most)
	}
	m.stillLoading(t)
}

// A node that asks for itself in a loop while the copy loads takes at most
// its own bound of the reads alone (earlyReadsPerNode a second), and
// leaves the rest to the other nodes: another node asking meanwhile is
// answered each time. Without a bound a node, the greedy one takes every
// read the mesh's bound lets through, and the other gets 503s.
func TestAGreedyNodeLeavesReadsAloneToTheOthers(t *testing.T) {
	t.Parallel()
	const perSecond = 20 // twice a node's own bound
	cfg := service.Config{MaxQueueWait: time.Minute}
	cfg.SetEarlyReadsPerSecond(perSecond)
	m := newLoadingMesh(t, buckets.Config{}, synth.Config{Nodes: 2, Modules: 2, Needs: 2}, nil, cfg)
	greedy, other := m.mesh.Nodes[0].Name, m.mesh.Nodes[1].Name
	ctx, stop := context.WithCancel(t.Context())
	var asked, refused atomic.Int64
	var greed sync.WaitGroup
	for range 4 {
		greed.Go(func() {
			pace := time.NewTicker(10 * time.Millisecond) // each greedy asker's rate
			defer pace.Stop()
			for ctx.Err() == nil {
				_, err := client.New(m.admin).Compose(ctx, &provisionerv1.ComposeRequest{Node: greedy})
				asked.Add(1)
				var werr *wire.Error
				if errors.As(err, &werr) && strings.Contains(werr.Sentence(), fmt.Sprintf("reads node %s alone at most", greedy)) {
					refused.Add(1)
				}
				select {
				case <-ctx.Done():
				case <-pace.C:
				}
			}
		})
	}
	defer greed.Wait()
	defer stop()
	// The other node asks each time the greedy one has just been refused
	// for its own bound again: while it takes all it may.
	for range 3 {
		seen := refused.Load()
		natstest.CheckFor(t, 10*time.Second, func() error {
			if refused.Load() == seen {
				return fmt.Errorf("%s asked %d times in a loop, and no more were refused for its own bound (%d so far)", greedy, asked.Load(), seen)
			}
			return nil
		})
		if _, err := client.New(m.admin).Compose(t.Context(), &provisionerv1.ComposeRequest{Node: other}); err != nil {
			t.Errorf("%s asked while %s asked in a loop: %v", other, greedy, err)
		}
	}
	stop()
	greed.Wait()
	if refused.Load() == 0 {
		t.Errorf("%s asked %d times in a loop, and none was refused for its own bound", greedy, asked.Load())
	}
	t.Logf("%s asked %d times, %d refused for its own bound", greedy, asked.Load(), refused.Load())
	m.stillLoading(t)
}

// checkStillLoading fails the test unless err is the 503 of a loading copy
// that says want.
func checkStillLoading(t *testing.T, name string, err error, want string) {
	t.Helper()
	var werr *wire.Error
	if !errors.As(err, &werr) || werr.Code() != wire.CodeUnavailable || !strings.Contains(werr.Sentence(), want) || !strings.Contains(werr.Sentence(), "still loading") {
		t.Errorf("%s while loading = %v, want a 503 that says the copy is still loading and %q", name, err, want)
	}
}

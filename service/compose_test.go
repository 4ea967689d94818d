package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// composeMesh is node ace with a need of every sort, and node novox.
type composeMesh struct {
	nc        *nats.Conn
	ace       *nodeclient.Client
	revisions *provisionerv1.Revisions // the last revision written to each bucket
}

func newComposeMesh(t *testing.T, options ...func(*service.Config)) *composeMesh {
	t.Helper()
	ctx := context.Background()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc, options...)
	m := &composeMesh{nc: nc, revisions: &provisionerv1.Revisions{}}
	clients := map[string]*nodeclient.Client{}
	for _, node := range []string{"ace", "novox"} {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		clients[node] = c
	}
	m.ace = clients["ace"]
	need := func(node, module, kind, name string, n *provisionerv1.Need) {
		t.Helper()
		rev, err := clients[node].PutNeed(ctx, module, kind, name, n)
		if err != nil {
			t.Fatal(err)
		}
		m.revisions.Needs = rev
	}
	item := func(node, collection, contributor, value string) {
		t.Helper()
		rev, err := clients[node].PutCollectItem(ctx, collection, contributor, &provisionerv1.CollectItem{Value: value})
		if err != nil {
			t.Fatal(err)
		}
		m.revisions.Collect = rev
	}
	need("ace", "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	need("ace", "web", "config", "db_url", &provisionerv1.Need{Placeholder: "${config:db_url}"})
	need("ace", "web", "secret", "token", &provisionerv1.Need{Placeholder: "${secret:token}"})
	need("ace", "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "database", Local: "ro"})
	need("ace", "web", "shell", "zsh:normal", &provisionerv1.Need{Placeholder: "${shell:zsh:normal}"})
	need("ace", "worker", "bound", "cache", &provisionerv1.Need{Placeholder: "${bound:cache}", Provider: "redis"})
	need("ace", "worker", "collected", "plugins", &provisionerv1.Need{Placeholder: "${collected:plugins}"})
	need("ace", "worker", "gpu", "cuda", &provisionerv1.Need{Placeholder: "${gpu:cuda}"})
	need("ace", "worker", "bound", "queue", &provisionerv1.Need{Placeholder: "${bound:queue}"})
	need("ace", "worker", "config", "a:b", &provisionerv1.Need{Placeholder: "${config:a:b}"})
	need("novox", "api", "port", "grpc", &provisionerv1.Need{Placeholder: "${port:grpc}"})
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	rev, err := needs.Put(ctx, "ace.worker.dir", nil)
	if err != nil {
		t.Fatal(err)
	}
	m.revisions.Needs = rev
	item("ace", "shell:zsh:normal", "web", "export PORT=8080")
	item("ace", "shell:zsh:normal", "db", "alias db=psql")
	item("ace", "plugins", "worker", "cuda")
	item("novox", "shell:zsh:normal", "api", "export API=1")
	return m
}

// compose asks for a composition once the copy holds every write.
func (m *composeMesh) compose(t *testing.T, req *provisionerv1.ComposeRequest) *provisionerv1.ComposeResponse {
	t.Helper()
	if req.MinRevisions == nil {
		req.MinRevisions = m.revisions
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := client.New(m.nc).Compose(ctx, req)
	if err != nil {
		t.Fatalf("Compose(%v): %v", req, err)
	}
	return out
}

// ignoreVolatile leaves out what differs between equal compositions and
// what the tests do not fix: phases and revisions, and the digest, which
// TestPlanDigest checks.
var ignoreVolatile = []cmp.Option{
	protocmp.Transform(),
	protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases", "revisions", "plan_digest"),
	protocmp.IgnoreFields(&provisionerv1.PlanItem{}, "revision"),
	protocmp.IgnoreFields(&provisionerv1.CollectedItem{}, "revision"),
}

func bucketKey(bucket, key string) *provisionerv1.PlanItem_Bucket {
	return &provisionerv1.PlanItem_Bucket{Bucket: &provisionerv1.BucketKey{Bucket: bucket, Key: key}}
}

//nolint:tparallel // the steps write to one mesh in turn.
func TestComposeNode(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t)
	got := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"})
	want := &provisionerv1.ComposeResponse{
		Node: "ace",
		Plans: []*provisionerv1.ModulePlan{
			{Module: "web", Items: []*provisionerv1.PlanItem{
				{Kind: "bound", Name: "db", Placeholder: "${bound:db}", Owner: "pg", Location: bucketKey("pg_bound", "ace.web.database.ro")},
				{Kind: "config", Name: "db_url", Placeholder: "${config:db_url}", Owner: "mesh-config", Location: bucketKey("mesh-config_values", "ace.web.db_url")},
				{Kind: "port", Name: "http", Placeholder: "${port:http}", Owner: "mesh-controller", Location: bucketKey("mesh-controller_assignments", "ace.web")},
				{Kind: "secret", Name: "token", Placeholder: "${secret:token}", Owner: "mesh-vault",
					Location: &provisionerv1.PlanItem_Verb{Verb: &provisionerv1.VerbSource{Seat: "mesh-vault", Subject: "mesh-vault.secret"}}},
				{Kind: "shell", Name: "zsh:normal", Placeholder: "${shell:zsh:normal}", Owner: "mesh-provisioner",
					Location: bucketKey(keys.CollectBucket, "ace.shell=3Azsh=3Anormal.*"), Collection: "shell:zsh:normal",
					Items: []*provisionerv1.CollectedItem{
						{Contributor: "db", Item: &provisionerv1.CollectItem{Value: "alias db=psql"}},
						{Contributor: "web", Item: &provisionerv1.CollectItem{Value: "export PORT=8080"}},
					}},
			}},
			{Module: "worker", Items: []*provisionerv1.PlanItem{
				{Kind: "bound", Name: "cache", Placeholder: "${bound:cache}", Owner: "redis", Location: bucketKey("redis_bound", "ace.worker.cache")},
				{Kind: "collected", Name: "plugins", Placeholder: "${collected:plugins}", Owner: "mesh-provisioner",
					Location: bucketKey(keys.CollectBucket, "ace.plugins.*"), Collection: "plugins",
					Items: []*provisionerv1.CollectedItem{{Contributor: "worker", Item: &provisionerv1.CollectItem{Value: "cuda"}}}},
			}},
		},
		Provisions: []*provisionerv1.Provision{
			{Provider: "pg", Bucket: "pg_bound", Key: "ace.web.database.ro", Module: "web", Provision: "database", Local: "ro", Name: "db"},
			{Provider: "redis", Bucket: "redis_bound", Key: "ace.worker.cache", Module: "worker", Provision: "cache", Name: "cache"},
		},
		Refusals: []*provisionerv1.Refusal{
			{Key: "ace.worker.bound.queue", Module: "worker", Kind: "bound", Name: "queue", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_UNFILLABLE_KEY_SHAPE,
				Detail: `kind "bound" is answered by each provider in bucket <provider>_bound, and the need's provider "" is empty`},
			{Key: "ace.worker.config.a=3Ab", Module: "worker", Kind: "config", Name: "a:b", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_UNFILLABLE_KEY_SHAPE,
				Detail: `cannot render key: <node>.<module>.<name>: <name> "a:b" holds ':' at byte 1; a token holds only A-Z a-z 0-9 - _ = /`},
			{Key: "ace.worker.dir", Module: "worker", Kind: "dir", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_MALFORMED_NEED,
				Detail: `malformed key: "ace.worker.dir" has 3 tokens, want 4 (<node>.<module>.<kind>.<name>)`},
			{Key: "ace.worker.gpu.cuda", Module: "worker", Kind: "gpu", Name: "cuda", Reason: provisionerv1.RefusalReason_REFUSAL_REASON_NO_DOMAIN,
				Detail: `no registry entry answers kind "gpu"`},
		},
	}
	if diff := cmp.Diff(want, got, ignoreVolatile...); diff != "" {
		t.Errorf("composition of ace (-want +got):\n%s", diff)
	}

	var phases []string
	for _, p := range got.GetPhases() {
		phases = append(phases, p.GetName())
	}
	if diff := cmp.Diff([]string{"wait", "read", "resolve", "items"}, phases); diff != "" {
		t.Errorf("phases (-want +got):\n%s", diff)
	}
	if r := got.GetRevisions(); r.GetNeeds() < m.revisions.GetNeeds() || r.GetCollect() < m.revisions.GetCollect() || r.GetRegistry() == 0 {
		t.Errorf("revisions %v, want at least %v", r, m.revisions)
	}
	for _, item := range got.GetPlans()[0].GetItems() {
		if item.GetRevision() == 0 {
			t.Errorf("plan item %s:%s has no revision", item.GetKind(), item.GetName())
		}
	}

	t.Run("one module", func(t *testing.T) {
		got := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", Module: "worker"})
		wantWorker := &provisionerv1.ComposeResponse{Node: "ace", Module: "worker", Plans: want.Plans[1:], Provisions: want.Provisions[1:], Refusals: want.Refusals}
		if diff := cmp.Diff(wantWorker, got, ignoreVolatile...); diff != "" {
			t.Errorf("composition of ace's worker (-want +got):\n%s", diff)
		}
	})
	t.Run("identical across runs", func(t *testing.T) {
		again := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"})
		if diff := cmp.Diff(got, again, ignoreVolatile...); diff != "" {
			t.Errorf("second composition (-first +second):\n%s", diff)
		}
	})
	t.Run("another node", func(t *testing.T) {
		got := m.compose(t, &provisionerv1.ComposeRequest{Node: "novox"})
		if len(got.GetPlans()) != 1 || got.GetPlans()[0].GetItems()[0].GetLocation().(*provisionerv1.PlanItem_Bucket).Bucket.GetKey() != "novox.api" || len(got.GetRefusals())+len(got.GetProvisions()) != 0 {
			t.Errorf("composition of novox: %v", got)
		}
	})
	t.Run("an unknown node", func(t *testing.T) {
		got := m.compose(t, &provisionerv1.ComposeRequest{Node: "zed"})
		if len(got.GetPlans())+len(got.GetRefusals())+len(got.GetProvisions()) != 0 {
			t.Errorf("composition of zed: %v", got)
		}
	})
}

func TestComposeReadsYourWrites(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t)
	ctx := context.Background()
	// Ask right after each write, with its revision: the write is always in.
	for i, name := range []string{"a", "b", "c", "d", "e"} {
		rev, err := m.ace.PutNeed(ctx, "api", "port", name, &provisionerv1.Need{Placeholder: "${port:" + name + "}"})
		if err != nil {
			t.Fatal(err)
		}
		out, err := client.New(m.nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", Module: "api", MinRevisions: &provisionerv1.Revisions{Needs: rev}})
		if err != nil {
			t.Fatal(err)
		}
		if got := len(out.GetPlans()[0].GetItems()); got != i+1 {
			t.Fatalf("after writing need %d at revision %d, the plan holds %d items", i+1, rev, got)
		}
		if out.GetRevisions().GetNeeds() < rev {
			t.Errorf("composed at needs revision %d, before the write at %d", out.GetRevisions().GetNeeds(), rev)
		}
	}
	// The provisioning verb reads its writes the same way.
	rev, err := m.ace.PutApplied(ctx, "api", &provisionerv1.Applied{PlanDigest: "x"})
	if err != nil {
		t.Fatal(err)
	}
	a, err := client.New(m.nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED, Node: "ace", MinRevision: rev})
	if err != nil || len(a.GetApplied()) != 1 {
		t.Errorf("applied after writing at %d: %v, %v", rev, a, err)
	}
}

func TestComposeWaitIsBounded(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t, func(c *service.Config) { c.RevisionWait = 200 * time.Millisecond })
	ctx := context.Background()
	// The refusal must come at all: the asker waits at most 50 times the
	// revision wait of 200ms for it, and fails if it gives up first.
	asked, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	start := time.Now()
	_, err := client.New(m.nc).Compose(asked, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: 1 << 40}})
	if asked.Err() != nil {
		t.Fatalf("Compose at a revision never reached was not refused within 10s: %v", err)
	}
	t.Logf("refused after %s", time.Since(start).Round(time.Millisecond))
	var serr *wire.Error
	if !errors.As(err, &serr) || serr.Code() != wire.CodeUnavailable {
		t.Fatalf("Compose at a revision never reached = %v, want a 503", err)
	}
	if !strings.Contains(serr.Sentence(), "copy of mesh-provisioner_needs is at revision") || !strings.Contains(serr.Sentence(), "behind the 1099511627776 asked for, after waiting 200ms") {
		t.Errorf("503 sentence: %q", serr.Sentence())
	}
	_, err = client.New(m.nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, MinRevision: 1 << 40})
	if !errors.As(err, &serr) || serr.Code() != wire.CodeUnavailable || !strings.Contains(serr.Sentence(), keys.CollectBucket) {
		t.Errorf("Provisioning at a revision never reached = %v, want a 503 naming the collect bucket", err)
	}
	// The service still answers.
	m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"})
}

func TestComposeRefusesBadRequests(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t)
	for _, tt := range []struct {
		req  *provisionerv1.ComposeRequest
		says string
	}{
		{&provisionerv1.ComposeRequest{}, "node is required"},
		{&provisionerv1.ComposeRequest{Node: "a.b"}, `node "a.b" can match no key`},
		{&provisionerv1.ComposeRequest{Node: "ace", Module: "*"}, `module "*" can match no key`},
	} {
		_, err := client.New(m.nc).Compose(context.Background(), tt.req)
		var serr *wire.Error
		if !errors.As(err, &serr) || serr.Code() != wire.CodeBadRequest || !strings.Contains(serr.Sentence(), tt.says) {
			t.Errorf("Compose(%v) = %v, want a 400 saying %q", tt.req, err, tt.says)
		}
	}
}

func TestCaptureReplaysTheSameCompositions(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t)
	live := map[string]*provisionerv1.ComposeResponse{}
	for _, node := range []string{"ace", "novox"} {
		live[node] = m.compose(t, &provisionerv1.ComposeRequest{Node: node})
	}
	js, _ := jetstream.New(m.nc)
	capture, err := mirror.Capture(context.Background(), js)
	if err != nil {
		t.Fatal(err)
	}
	if len(capture.GetBuckets()) != 5 {
		t.Fatalf("capture holds %d buckets", len(capture.GetBuckets()))
	}
	replay, err := answers.NewReplay(capture)
	if err != nil {
		t.Fatal(err)
	}
	for node, want := range live {
		got, err := replay.Compose(&provisionerv1.ComposeRequest{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")); diff != "" {
			t.Errorf("replayed composition of %s (-live +replay):\n%s", node, diff)
		}
	}
	want := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", Module: "web"})
	got, err := replay.Compose(&provisionerv1.ComposeRequest{Node: "ace", Module: "web"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")); diff != "" {
		t.Errorf("replayed module composition (-live +replay):\n%s", diff)
	}
}

// syncBuffer is a log destination the service's goroutines may share.
type syncBuffer struct{ testlog.Buffer }

// lines returns the log lines with msg so far, decoded.
func (b *syncBuffer) lines(t *testing.T, msgPrefix string) []map[string]any {
	t.Helper()
	var out []map[string]any
	for _, line := range strings.Split(strings.TrimSpace(b.String()), "\n") {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			continue
		}
		if msg, _ := rec["msg"].(string); strings.HasPrefix(msg, msgPrefix) {
			out = append(out, rec)
		}
	}
	return out
}

func TestSlowCompositionLog(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	m := newComposeMesh(t, func(c *service.Config) {
		c.SlowCompose = time.Nanosecond // every composition is slow
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"})
	m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", Module: "web"}) // within the minute: kept back
	m.compose(t, &provisionerv1.ComposeRequest{Node: "novox", Module: "web"})

	// A line a minute a node: a node asking for its slow plan in a loop
	// does not flood the log.
	lines := logs.lines(t, "slow composition")
	if len(lines) != 2 {
		t.Fatalf("%d slow composition lines, want 2 (one a node):\n%s", len(lines), logs.String())
	}
	if lines[1]["node"] != "novox" || lines[1]["module"] != "web" {
		t.Errorf("second line's node and module = %v, %v, want novox, web", lines[1]["node"], lines[1]["module"])
	}
	phases, ok := lines[0]["phases"].(map[string]any)
	if !ok || len(phases) != 4 || phases["resolve"] == nil || lines[0]["node"] != "ace" {
		t.Errorf("slow composition line lacks its node or phases: %v", lines[0])
	}
}

func TestComposeFollowsRegistryChanges(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t)
	ctx := context.Background()
	before := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", Module: "web"})
	m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"}) // resolved once, and remembered

	// The port kind moves to another bucket: the next composition resolves
	// the port needs again, and only the registry changed.
	entry := &provisionerv1.RegistryEntry{Kind: "port", Owner: "mesh-ports", Description: "Ports, from their own domain.",
		Source: &provisionerv1.RegistryEntry_Bucket{Bucket: &provisionerv1.BucketSource{Bucket: "mesh-ports", KeyShape: "<node>.<module>.<name>"}}}
	value, err := proto.Marshal(entry)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := servicetest.Bucket(t, m.nc, keys.RegistryBucket).Put(ctx, "port", value)
	if err != nil {
		t.Fatal(err)
	}
	after := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Registry: rev}})
	var port *provisionerv1.PlanItem
	for _, item := range after.GetPlans()[0].GetItems() {
		if item.GetKind() == "port" {
			port = item
		}
	}
	if diff := cmp.Diff(&provisionerv1.PlanItem{Kind: "port", Name: "http", Placeholder: "${port:http}", Owner: "mesh-ports", Location: bucketKey("mesh-ports", "ace.web.http")},
		port, ignoreVolatile...); diff != "" {
		t.Errorf("port need after the registry changed (-want +got):\n%s", diff)
	}
	// Everything else is as before.
	webBefore, webAfter := before.GetPlans()[0].GetItems(), after.GetPlans()[0].GetItems()
	for i := range webBefore {
		if webBefore[i].GetKind() == "port" {
			continue
		}
		if diff := cmp.Diff(webBefore[i], webAfter[i], ignoreVolatile...); diff != "" {
			t.Errorf("%s need changed with the port entry (-before +after):\n%s", webBefore[i].GetKind(), diff)
		}
	}
}

func TestWaitingRequestsAreBounded(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t, func(c *service.Config) {
		c.MaxWaiting = 1
		c.RevisionWait = 2 * time.Second
	})
	ctx := context.Background()
	far := &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: 1 << 40}}
	first := make(chan error, 1)
	go func() {
		_, err := client.New(m.nc).Compose(ctx, far)
		first <- err
	}()
	// Another request finds the one place taken, and is refused at once.
	// (Until the first is waiting, an attempt may take the place itself and
	// time out here; the next is refused.)
	var serr *wire.Error
	for attempt := 0; ; attempt++ {
		short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		_, err := client.New(m.nc).Compose(short, far)
		cancel()
		if errors.As(err, &serr) && strings.Contains(serr.Sentence(), "1 requests already wait") {
			break
		}
		if attempt == 3 {
			t.Fatalf("a request beyond the one that may wait was not refused at once: %v", err)
		}
	}
	if serr.Code() != wire.CodeUnavailable {
		t.Errorf("code %d, want 503", serr.Code())
	}
	// The first request waited its bounded wait, or was the one refused.
	if err := <-first; !errors.As(err, &serr) || serr.Code() != wire.CodeUnavailable {
		t.Errorf("the first request ended with %v, want a 503", err)
	}
	m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"}) // and the service still answers
}

// A composition read from the providers' buckets is reused while the keys
// of its own node in them are unchanged, whatever the provider binds for
// other nodes; a key of its own composes it again.
func TestComposeIsReusedUntilItsNodesProviderKeysChange(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t)
	ctx := context.Background()
	pg := providerBucket(t, m.nc, "pg")
	// compose asks for ace once the copy holds the provider's write at rev,
	// and returns its last phase's name ("reused" or "items") and the
	// revision its pg provision was bound at.
	compose := func(rev uint64) (string, uint64) {
		t.Helper()
		req := proto.CloneOf(m.revisions)
		req.Bound = map[string]uint64{wire.BoundBucket("pg"): rev}
		out := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: req})
		if out.GetRevisions().GetBound()[wire.BoundBucket("pg")] < rev {
			t.Errorf("answered at pg_bound revision %d, want at least %d", out.GetRevisions().GetBound()[wire.BoundBucket("pg")], rev)
		}
		phases := out.GetPhases()
		for _, p := range out.GetProvisions() {
			if p.GetProvider() == "pg" {
				return phases[len(phases)-1].GetName(), p.GetBoundRevision()
			}
		}
		t.Fatalf("no provision of pg in %v", out)
		return "", 0
	}
	// pg offers the provision ace's web binds (its manifest written from
	// ace), so that a key bound for ace reads as bound, not refused.
	_, rev, err := m.ace.PutManifest(ctx, "pg", &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "database"}}})
	if err != nil {
		t.Fatal(err)
	}
	m.revisions.Manifests = rev
	compose(put(t, pg, "novox.api.database", []byte("bound"))) // the bucket found

	var aceBound uint64 // the revision of ace's own key: its provision's
	for _, step := range []struct{ name, key, phase string }{
		{"another node's key", "novox.api.cache", "reused"},
		{"a key of a node whose name begins alike", "acer.web.database.ro", "reused"},
		{"ace's own key", "ace.web.database.ro", "items"},
		{"another node's key again", "novox.api.database", "reused"},
	} {
		rev := put(t, pg, step.key, []byte("bound"))
		if strings.HasPrefix(step.key, "ace.") {
			aceBound = rev
		}
		if phase, bound := compose(rev); phase != step.phase || bound != aceBound {
			t.Errorf("after %s: last phase %q, bound at %d; want %q, bound at %d", step.name, phase, bound, step.phase, aceBound)
		}
	}
}

// A provider's bucket over Config.ProviderMaxKeys is not held: the
// composition reads its provisions as pending and lists it behind.
func TestComposeHoldsNoProvidersBucketOverItsBound(t *testing.T) {
	t.Parallel()
	m := newComposeMesh(t, func(c *service.Config) { c.ProviderMaxKeys = 2 })
	pg := providerBucket(t, m.nc, "pg")
	for _, key := range []string{"ace.web.database.ro", "novox.api.db", "zed.api.db"} {
		put(t, pg, key, []byte("bound"))
	}
	natstest.CheckFor(t, 10*time.Second, func() error {
		out := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"})
		if !slices.Contains(out.GetBehind(), wire.BoundBucket("pg")) {
			return fmt.Errorf("behind %v, want pg_bound listed", out.GetBehind())
		}
		for _, p := range out.GetProvisions() {
			if p.GetBoundRevision() != 0 {
				return fmt.Errorf("%s's provision bound at %d, want pending", p.GetProvider(), p.GetBoundRevision())
			}
		}
		return nil
	})
}

// providerBucket makes provider's bucket, as the provider would.
func providerBucket(t *testing.T, nc *nats.Conn, provider string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: wire.BoundBucket(provider)})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

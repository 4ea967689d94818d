package plans_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// RunPlans keeps each node's digest equal to its composition's, writes
// only digests that changed, removes the key of a node with no record left,
// and a second writer (a new tenure) rewrites nothing that is current.
//
//nolint:tparallel // the steps write to one mesh in turn.
func TestRunPlansKeepsEachNodesDigest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	ace, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	novox, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "novox"})
	// Each node's own need: a digest is written again only when it
	// differs, so ace's keeps the revision its first pass saw, which may
	// precede novox's need.
	revs := map[*nodeclient.Client]uint64{}
	for _, c := range []*nodeclient.Client{ace, novox} {
		rev, err := c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		revs[c] = rev
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.RunPlans(runCtx, service.PlansConfig{KV: plans, Interval: 5 * time.Millisecond}) }()

	digestOf := func(node string) (*provisionerv1.PlanDigest, uint64, error) { return readKey(ctx, plans, node) }
	// current says whether node's digest is its composition's at least at
	// needs revision rev.
	current := func(node string, rev uint64) error {
		d, err := composedAs(ctx, nc, plans, node, &provisionerv1.Revisions{Needs: rev})
		if err != nil {
			return err
		}
		if d.GetRevisions().GetNeeds() < rev || d.GetRevisions().GetRegistry() == 0 {
			return fmt.Errorf("%s: the digest's revisions %v, want needs at least %d and the registry's", node, d.GetRevisions(), rev)
		}
		return nil
	}
	natstest.CheckFor(t, 5*time.Second, func() error { return errors.Join(current("ace", revs[ace]), current("novox", revs[novox])) })
	_, novoxRev, _ := digestOf("novox")

	t.Run("a change writes the node's digest only", func(t *testing.T) {
		rev, err := ace.PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"})
		if err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 5*time.Second, func() error { return current("ace", rev) })
		if _, rev, _ := digestOf("novox"); rev != novoxRev {
			t.Errorf("novox's digest rewritten at %d (was %d) by ace's change", rev, novoxRev)
		}
	})
	t.Run("a node with no record left loses its key", func(t *testing.T) {
		if _, err := novox.DeleteNeed(ctx, "web", "port", "http"); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 5*time.Second, func() error {
			if _, _, err := digestOf("novox"); !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("novox's key: %w", err)
			}
			return nil
		})
	})
	t.Run("a node that comes back gets its key again", func(t *testing.T) {
		// Its key's last message is a delete marker: the digest is
		// published expecting none, refused, and made as Create makes it.
		rev, err := novox.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 5*time.Second, func() error { return current("novox", rev) })
	})
	t.Run("a new tenure rewrites nothing current", func(t *testing.T) {
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		before, err := plans.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		again, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() { _ = svc.RunPlans(again, service.PlansConfig{KV: plans, Interval: 5 * time.Millisecond}) }()
		// A change made after it started shows its first pass is over.
		rev, err := ace.PutNeed(ctx, "web", "port", "metrics", &provisionerv1.Need{Placeholder: "${port:metrics}"})
		if err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 5*time.Second, func() error { return current("ace", rev) })
		after, err := plans.Status(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if writes := after.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq - before.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq; writes != 1 {
			t.Errorf("%d writes by the new tenure, want 1 (ace's change)", writes)
		}
	})
}

// A node whose last record goes while another node's first comes, within
// one interval, leaves the count of nodes as it was: its key is still
// removed, by the writer's sweep.
func TestRunPlansRemovesTheKeyOfANodeGoneAsAnotherCame(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	ace, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	bob, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "bob"})
	need := &provisionerv1.Need{Placeholder: "${port:http}"}
	if _, err := ace.PutNeed(ctx, "web", "port", "http", need); err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	defer stop()
	// An interval long enough that the delete and the put below fall
	// within one.
	go func() { _ = svc.RunPlans(runCtx, service.PlansConfig{KV: plans, Interval: 500 * time.Millisecond}) }()
	has := func(node string) bool {
		_, err := plans.Get(ctx, node)
		return err == nil
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if !has("ace") {
			return errors.New("no key for ace")
		}
		return nil
	})
	if _, err := ace.DeleteNeed(ctx, "web", "port", "http"); err != nil {
		t.Fatal(err)
	}
	if _, err := bob.PutNeed(ctx, "web", "port", "http", need); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if has("ace") || !has("bob") {
			return fmt.Errorf("ace's key held: %v, bob's: %v; want ace's removed and bob's written", has("ace"), has("bob"))
		}
		return nil
	})
}

// A registry entry or a provider's manifest that changes composes again
// the nodes whose last composition read it, and no other: ace reads the
// port entry, novox the secret entry, bob the bound entry and provider
// pg's manifest.
func TestAChangeComposesOnlyItsReaders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	registryKV := servicetest.Bucket(t, nc, keys.RegistryBucket)
	node := func(name string) *nodeclient.Client {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: name})
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	ace, novox, bob, pgHost := node("ace"), node("novox"), node("bob"), node("pghost")
	for _, w := range []struct {
		c          *nodeclient.Client
		kind, name string
		need       *provisionerv1.Need
	}{
		{ace, "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}},
		{novox, "secret", "token", &provisionerv1.Need{Placeholder: "${secret:token}"}},
		{bob, "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "db"}},
	} {
		if _, err := w.c.PutNeed(ctx, "web", w.kind, w.name, w.need); err != nil {
			t.Fatal(err)
		}
	}
	// pg's bucket, as pg makes it: bob's composition reads it, and the
	// copy follows it from the start rather than looking for it again.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.BoundBucket("pg")}); err != nil {
		t.Fatal(err)
	}
	manifest := &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}}
	if _, _, err := pgHost.PutManifest(ctx, "pg", manifest); err != nil {
		t.Fatal(err)
	}
	servicetest.RunPlans(t, svc, nc, 5*time.Millisecond)

	digestOf := func(node string) (string, error) {
		d, _, err := readKey(ctx, plans, node)
		return d.GetDigest(), err
	}
	stats := func() *provisionerv1.PlansStats {
		data, err := wire.DecodeStatsData(svc.Stats().Endpoints[0].Data)
		if err != nil {
			t.Fatal(err)
		}
		return data.GetPlans()
	}
	composed := func() uint64 { return stats().GetComposed() }
	digests := map[string]string{}
	natstest.CheckFor(t, 10*time.Second, func() error {
		for _, n := range []string{"ace", "novox", "bob"} {
			d, err := digestOf(n)
			if err != nil {
				return fmt.Errorf("%s's digest: %w", n, err)
			}
			digests[n] = d
		}
		return nil
	})
	// settled waits until the writer has composed nothing for ten of its
	// intervals and written what it composed, and reads every digest
	// then: a record that reached the copy after a pass's look is
	// composed by the next, and must not count as the change's.
	settled := func() uint64 {
		t.Helper()
		last, still := composed(), 0
		natstest.CheckFor(t, 10*time.Second, func() error {
			st := stats()
			if st.GetComposed() != last || st.GetPending() != 0 {
				last, still = st.GetComposed(), 0
			}
			if still++; still < 5 { // polled every 10 ms
				return fmt.Errorf("the writer composed until %d compositions, %d pending", last, st.GetPending())
			}
			return nil
		})
		for _, n := range []string{"ace", "novox", "bob"} {
			d, err := digestOf(n)
			if err != nil {
				t.Fatalf("%s's digest: %v", n, err)
			}
			digests[n] = d
		}
		return last
	}
	// changes applies change, waits for node's digest to change with it,
	// and returns how many compositions the writer made meanwhile: a pass
	// composes every node it takes before it writes any digest.
	changes := func(node string, change func()) uint64 {
		t.Helper()
		before := settled()
		change()
		natstest.CheckFor(t, 10*time.Second, func() error {
			d, err := digestOf(node)
			if err != nil {
				return fmt.Errorf("%s's digest: %w", node, err)
			}
			if d == digests[node] {
				return fmt.Errorf("%s's digest is still %s", node, d)
			}
			digests[node] = d
			return nil
		})
		return composed() - before
	}

	// secretOn makes the secret entry answer on subject.
	secretOn := func(subject string) func() {
		return func() {
			e, err := registryKV.Get(ctx, "secret")
			if err != nil {
				t.Fatal(err)
			}
			entry := &provisionerv1.RegistryEntry{}
			if err := proto.Unmarshal(e.Value(), entry); err != nil {
				t.Fatal(err)
			}
			entry.GetVerb().Subject = subject
			value, err := proto.Marshal(entry)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := registryKV.Put(ctx, "secret", value); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The secret entry answers on another subject now: novox's plan.
	n := changes("novox", secretOn("mesh-vault.secret.v2"))
	if n != 1 {
		t.Errorf("the secret entry changed: %d compositions, want 1 (novox's)", n)
	}
	// pg offers more: bob's plan, which names pg's manifest.
	n = changes("bob", func() {
		manifest.Offers = append(manifest.Offers, &provisionerv1.Offer{Provision: "cache"})
		if _, _, err := pgHost.PutManifest(ctx, "pg", manifest); err != nil {
			t.Fatal(err)
		}
	})
	if n != 1 {
		t.Errorf("pg's manifest changed: %d compositions, want 1 (bob's)", n)
	}
	for _, other := range []string{"ace", "novox"} {
		if d, err := digestOf(other); err != nil || d != digests[other] {
			t.Errorf("%s's digest changed to %s (%v)", other, d, err)
		}
	}

	// ace needs a secret in module api, then a port more in module web:
	// each composes that module alone, and what api reads stays known, so
	// the secret entry's next change composes ace too.
	for _, w := range []struct{ module, kind, name string }{{"api", "secret", "key"}, {"web", "port", "admin"}} {
		changes("ace", func() {
			need := &provisionerv1.Need{Placeholder: "${" + w.kind + ":" + w.name + "}"}
			if _, err := ace.PutNeed(ctx, w.module, w.kind, w.name, need); err != nil {
				t.Fatal(err)
			}
		})
	}
	if n := changes("ace", secretOn("mesh-vault.secret.v3")); n != 2 {
		t.Errorf("the secret entry changed again: %d compositions, want 2 (novox's and ace's)", n)
	}
	// Each digest composed of modules composed again and sums kept is the
	// whole composition's.
	settled()
	for _, n := range []string{"ace", "novox", "bob"} {
		if _, err := composedAs(ctx, nc, plans, n, nil); err != nil {
			t.Error(err)
		}
	}
}

// A node's key that another writes with no digest (an empty value, or an
// empty digest) is another writer's, and the writer writes the node's
// digest back; it is not taken for the writer's own write in flight.
func TestRunPlansRepairsAnEmptyDigest(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ace.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}); err != nil {
		t.Fatal(err)
	}
	servicetest.RunPlans(t, svc, nc, 5*time.Millisecond)
	digest := func() error {
		d, _, err := readKey(ctx, plans, "ace")
		if err != nil {
			return err
		}
		if d.GetDigest() == "" {
			return errors.New("ace's key holds no digest")
		}
		return nil
	}
	natstest.CheckFor(t, 10*time.Second, digest)
	for _, foreign := range [][]byte{{}, {0x0a, 0x00}} { // empty, and digest ""
		if _, err := plans.Put(ctx, "ace", foreign); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 10*time.Second, digest)
	}
}

// readKey returns node's key in the plans bucket: its digest and revision.
func readKey(ctx context.Context, plans jetstream.KeyValue, node string) (*provisionerv1.PlanDigest, uint64, error) {
	e, err := plans.Get(ctx, node)
	if err != nil {
		return nil, 0, err
	}
	d := &provisionerv1.PlanDigest{}
	if err := proto.Unmarshal(e.Value(), d); err != nil {
		return nil, 0, err
	}
	return d, e.Revision(), nil
}

// composedAs returns node's key in the plans bucket if its digest is the
// one of node's composition at least at revisions least, and why not if not.
func composedAs(ctx context.Context, nc *nats.Conn, plans jetstream.KeyValue, node string, least *provisionerv1.Revisions) (*provisionerv1.PlanDigest, error) {
	d, _, err := readKey(ctx, plans, node)
	if err != nil {
		return nil, err
	}
	c, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: least})
	if err != nil {
		return nil, err
	}
	if d.GetDigest() != c.GetPlanDigest() {
		return nil, fmt.Errorf("%s: digest %s, composition's %s", node, d.GetDigest(), c.GetPlanDigest())
	}
	return d, nil
}

// A node whose last collection item goes, while its needs stay, has its
// digest written anew: the copy names no group emptied, so the writer's
// sweep finds the node's groups changed and composes it whole.
func TestRunPlansFollowsANodesLastItemGone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	ace, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if _, err := ace.PutNeed(ctx, "web", "shell", "zsh:normal", &provisionerv1.Need{Placeholder: "${shell:zsh:normal}"}); err != nil {
		t.Fatal(err)
	}
	rev, err := ace.PutCollectItem(ctx, "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "export A=1"})
	if err != nil {
		t.Fatal(err)
	}
	servicetest.RunPlans(t, svc, nc, 5*time.Millisecond)
	// current says whether ace's digest is its composition's at least at
	// collect revision rev.
	current := func(rev uint64) error {
		_, err := composedAs(ctx, nc, plans, "ace", &provisionerv1.Revisions{Collect: rev})
		return err
	}
	natstest.CheckFor(t, 5*time.Second, func() error { return current(rev) })
	// A need of another module changes: composed module by module, with
	// the item's collection kept.
	if _, err := ace.PutNeed(ctx, "api", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}); err != nil {
		t.Fatal(err)
	}
	gone, err := ace.DeleteCollectItem(ctx, "shell:zsh:normal", "web")
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() error { return current(gone) })
}

// A change the copy announces is composed at once, not at the writer's
// next interval (here an hour).
func TestRunPlansComposesAChangeWithoutAwaitingItsInterval(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := ace.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	servicetest.RunPlans(t, svc, nc, time.Hour)
	heard := func(rev uint64) error {
		d, _, err := readKey(ctx, plans, "ace")
		if err != nil {
			return err
		}
		if d.GetRevisions().GetNeeds() < rev {
			return fmt.Errorf("ace's digest at needs revision %d, want %d", d.GetRevisions().GetNeeds(), rev)
		}
		return nil
	}
	natstest.CheckFor(t, 5*time.Second, func() error { return heard(rev) }) // the first pass
	for _, name := range []string{"admin", "metrics", "debug"} {
		rev, err := ace.PutNeed(ctx, "web", "port", name, &provisionerv1.Need{Placeholder: "${port:" + name + "}"})
		if err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 5*time.Second, func() error { return heard(rev) })
	}
}

// A writer that keeps some nodes (a partitioned mesh's instance, for the
// partitions whose seats it holds) writes their keys alone, never deletes
// another's, and brings a node it comes to hold up to date at once.
func TestRunPlansKeepsTheNodesItHoldsAlone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc)
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	revs := map[string]uint64{}
	for _, node := range []string{"ace", "bob"} {
		c, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		rev, err := c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		revs[node] = rev
	}
	// bob's key, as another writer left it: a digest that is not his.
	if _, err := plans.Put(ctx, "bob", []byte{}); err != nil {
		t.Fatal(err)
	}
	var held atomic.Pointer[[]string]
	held.Store(&[]string{"ace"})
	changed := make(chan struct{}, 1)
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- svc.RunPlans(runCtx, service.PlansConfig{KV: plans, Interval: 5 * time.Millisecond, HoldsChanged: changed,
			Holds: func(node string) bool { return slices.Contains(*held.Load(), node) }})
	}()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("RunPlans: %v", err)
		}
	})
	natstest.CheckFor(t, 5*time.Second, func() error {
		_, err := composedAs(ctx, nc, plans, "ace", &provisionerv1.Revisions{Needs: revs["ace"]})
		return err
	})
	// bob's last need goes, and ace changes after: once ace's digest is
	// written, a pass has seen bob gone, and left his key.
	bob, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "bob"})
	if _, err := bob.DeleteNeed(ctx, "web", "port", "http"); err != nil {
		t.Fatal(err)
	}
	ace, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	rev, err := ace.PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"})
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		_, err := composedAs(ctx, nc, plans, "ace", &provisionerv1.Revisions{Needs: rev})
		return err
	})
	if e, err := plans.Get(ctx, "bob"); err != nil || len(e.Value()) != 0 {
		t.Fatalf("bob's key, which the writer does not hold: %v, %v; want it as another writer left it", e, err)
	}
	// bob comes back, and a pass leaves him (ace's change after his is
	// written); then the writer comes to hold him.
	bobRev, err := bob.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	if rev, err = ace.PutNeed(ctx, "web", "port", "metrics", &provisionerv1.Need{Placeholder: "${port:metrics}"}); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		_, err := composedAs(ctx, nc, plans, "ace", &provisionerv1.Revisions{Needs: rev})
		return err
	})
	held.Store(&[]string{"ace", "bob"})
	changed <- struct{}{}
	natstest.CheckFor(t, 5*time.Second, func() error {
		_, err := composedAs(ctx, nc, plans, "bob", &provisionerv1.Revisions{Needs: bobRev})
		return err
	})
}

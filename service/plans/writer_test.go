package plans_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
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
	var rev uint64
	for _, c := range []*nodeclient.Client{ace, novox} {
		var err error
		if rev, err = c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}); err != nil {
			t.Fatal(err)
		}
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- svc.RunPlans(runCtx, service.PlansConfig{KV: plans, Interval: 5 * time.Millisecond}) }()

	// digestOf returns a node's key: its digest and revision.
	digestOf := func(node string) (*provisionerv1.PlanDigest, uint64, error) {
		e, err := plans.Get(ctx, node)
		if err != nil {
			return nil, 0, err
		}
		d := &provisionerv1.PlanDigest{}
		return d, e.Revision(), proto.Unmarshal(e.Value(), d)
	}
	// current says whether node's digest is its composition's at least at
	// needs revision rev.
	current := func(node string, rev uint64) error {
		d, _, err := digestOf(node)
		if err != nil {
			return err
		}
		c, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: &provisionerv1.Revisions{Needs: rev}})
		if err != nil {
			return err
		}
		if d.GetDigest() != c.GetPlanDigest() {
			return fmt.Errorf("%s: digest %s, composition's %s", node, d.GetDigest(), c.GetPlanDigest())
		}
		if d.GetRevisions().GetNeeds() < rev || d.GetRevisions().GetRegistry() == 0 {
			return fmt.Errorf("%s: the digest's revisions %v, want needs at least %d and the registry's", node, d.GetRevisions(), rev)
		}
		return nil
	}
	natstest.CheckFor(t, 5*time.Second, func() error { return errors.Join(current("ace", rev), current("novox", rev)) })
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

package service

import (
	"context"
	"errors"
	"fmt"
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
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// A copy of the providers' buckets forgets a bucket that does not exist
// once nothing has named it for a while (here 200 ms). These tests make
// late's bucket after that: its binding of ace's key must still reach ace.

// TestPlansFindAProviderMadeLongAfterItWasNamed: the plans writer names
// the buckets of every node's provisions, so the bucket is followed however
// late it is made, and ace's digest changes unasked.
func TestPlansFindAProviderMadeLongAfterItWasNamed(t *testing.T) {
	t.Parallel()
	l := newLateProvider(t)
	js, err := jetstream.New(l.nc)
	if err != nil {
		t.Fatal(err)
	}
	plans, err := js.KeyValue(t.Context(), keys.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = l.s.RunPlans(t.Context(), PlansConfig{KV: plans, Interval: 10 * time.Millisecond}) }()
	digest := func() (string, error) {
		e, err := plans.Get(t.Context(), "ace")
		if err != nil {
			return "", err
		}
		d := &provisionerv1.PlanDigest{}
		err = proto.Unmarshal(e.Value(), d)
		return d.GetDigest(), err
	}
	var pending string
	natstest.CheckFor(t, 10*time.Second, func() (err error) {
		pending, err = digest()
		return err
	})
	// The copy forgets late's bucket, named by no read for longer than it
	// keeps one (between the writer's sweeps, plansSweep apart): the
	// bucket made next is found only if the writer names it again.
	forgotten := l.s.mirror.Bound.Forgotten()
	natstest.CheckFor(t, 10*time.Second, func() error {
		if l.s.mirror.Bound.Forgotten() == forgotten {
			return errors.New("late's bucket not forgotten yet")
		}
		return nil
	})

	l.bind(t)
	natstest.CheckFor(t, 10*time.Second, func() error {
		if d, err := digest(); err != nil || d == pending {
			return errors.Join(err, errors.New("ace's plan digest is still the one of its provision pending"))
		}
		return nil
	})
}

// TestComposeFindsAProviderForgottenMeanwhile: an instance that writes no
// plans, whose copy forgot the bucket while ace's answer was reused, finds
// it on ace's next composition, asked at no revision of it (ace's
// requests name it again after each time the copy forgets a bucket).
func TestComposeFindsAProviderForgottenMeanwhile(t *testing.T) {
	t.Parallel()
	l := newLateProvider(t)
	natstest.CheckFor(t, 10*time.Second, func() error {
		if _, err := l.bound(); err != nil {
			return err
		}
		if l.s.mirror.Bound.Forgotten() == 0 {
			return errors.New("late's bucket not forgotten yet")
		}
		return nil
	})
	boundRev := l.bind(t)
	natstest.CheckFor(t, 10*time.Second, func() error {
		if rev, err := l.bound(); err != nil || rev != boundRev {
			return errors.Join(err, fmt.Errorf("ace's provision bound at %d, want %d", rev, boundRev))
		}
		return nil
	})
}

// lateProvider is node ace, whose web needs provision db of provider late,
// whose bucket is not made yet.
type lateProvider struct {
	s  *Service
	nc *nats.Conn
}

func newLateProvider(t *testing.T) lateProvider {
	t.Helper()
	s, _, nc := startOnMesh(t, synth.Config{Nodes: 1, Modules: 1, Needs: 1},
		Config{boundRetry: 20 * time.Millisecond, boundForget: 200 * time.Millisecond})
	ace, err := nodeclient.New(t.Context(), nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := ace.PutManifest(t.Context(), "late", &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}}); err != nil {
		t.Fatal(err)
	}
	rev, err := ace.PutNeed(t.Context(), "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "late"})
	if err != nil {
		t.Fatal(err)
	}
	l := lateProvider{s: s, nc: nc}
	if _, err := client.New(nc).Compose(t.Context(), &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: rev}}); err != nil {
		t.Fatal(err)
	}
	if rev, err := l.bound(); err != nil || rev != 0 {
		t.Fatalf("before late's bucket is made: bound at %d, %v; want pending", rev, err)
	}
	return l
}

// bound composes ace and returns the revision its provision of late is
// bound at.
func (l lateProvider) bound() (uint64, error) {
	out, err := client.New(l.nc).Compose(context.Background(), &provisionerv1.ComposeRequest{Node: "ace"})
	if err != nil {
		return 0, err
	}
	if len(out.GetProvisions()) != 1 {
		return 0, fmt.Errorf("provisions %v, want late's", out.GetProvisions())
	}
	return out.GetProvisions()[0].GetBoundRevision(), nil
}

// bind makes late's bucket and binds ace's key, at the revision it
// returns.
func (l lateProvider) bind(t *testing.T) uint64 {
	t.Helper()
	js, err := jetstream.New(l.nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: wire.BoundBucket("late")})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(t.Context(), "ace.web.db", []byte("bound"))
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

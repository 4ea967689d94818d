package service_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/client"
	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/service/answers"
)

// A composition's plan digest is of what the node must apply: the same on
// every page and for a replay of the mesh, the same when a need is written
// again unchanged, another when a need changes.
//
//nolint:tparallel // the steps write to one mesh in turn.
func TestPlanDigest(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	m := newComposeMesh(t)
	first := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace"})
	digest := first.GetPlanDigest()
	if digest == "" || digest != compose.Digest(first) {
		t.Fatalf("plan digest %q, want compose.Digest of the answer, %q", digest, compose.Digest(first))
	}

	t.Run("every page carries the whole composition's", func(t *testing.T) {
		var pages []*provisionerv1.ComposeResponse
		for p, err := range client.New(m.nc).ComposePages(ctx, &provisionerv1.ComposeRequest{Node: "ace", PageSize: 2}) {
			if err != nil {
				t.Fatal(err)
			}
			pages = append(pages, p)
		}
		if len(pages) < 2 {
			t.Fatalf("%d pages, want several", len(pages))
		}
		for i, p := range pages {
			if p.GetPlanDigest() != digest {
				t.Errorf("page %d: digest %s, want %s", i, p.GetPlanDigest(), digest)
			}
		}
	})
	t.Run("a replay of the mesh composes the same digest", func(t *testing.T) {
		js, _ := jetstream.New(m.nc)
		capture, err := mirror.Capture(ctx, js)
		if err != nil {
			t.Fatal(err)
		}
		replay, err := answers.NewReplay(capture)
		if err != nil {
			t.Fatal(err)
		}
		replayed, err := replay.Compose(&provisionerv1.ComposeRequest{Node: "ace"})
		if err != nil {
			t.Fatal(err)
		}
		if replayed.GetPlanDigest() != digest {
			t.Errorf("replayed digest %s, want %s", replayed.GetPlanDigest(), digest)
		}
	})
	t.Run("a need written again unchanged keeps it", func(t *testing.T) {
		rev, err := m.ace.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		again := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: rev}})
		if again.GetPlanDigest() != digest {
			t.Errorf("digest %s after an unchanged write, want %s", again.GetPlanDigest(), digest)
		}
	})
	t.Run("a new need changes it", func(t *testing.T) {
		rev, err := m.ace.PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"})
		if err != nil {
			t.Fatal(err)
		}
		changed := m.compose(t, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: rev}})
		if changed.GetPlanDigest() == digest {
			t.Errorf("digest %s unchanged after the need changed", digest)
		}
	})
}

package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service/answers"
)

func TestSimulateThenCapture(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	servicetest.Start(t, nc)
	ctx := context.Background()

	var out bytes.Buffer
	if err := run(ctx, []string{"simulate", "--nodes", "3", "--modules", "4", "--needs", "10", "--builds", "50", "--bound", "50", "--nats-url", s.ClientURL()}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "wrote 3 nodes x 4 modules x 10 needs") {
		t.Errorf("simulate said %q", out.String())
	}
	file := filepath.Join(t.TempDir(), "mesh.pb")
	out.Reset()
	if err := run(ctx, []string{"capture", "--out", file, "--nats-url", s.ClientURL()}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	capture := &provisionerv1.Capture{}
	if err := proto.Unmarshal(data, capture); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	revisions := map[string]uint64{}
	bound := map[string]uint64{}
	for _, b := range capture.GetBuckets() {
		if strings.HasSuffix(b.GetBucket(), "_bound") {
			bound[b.GetBucket()] = b.GetRevision()
			continue
		}
		counts[b.GetBucket()] = len(b.GetEntries())
		revisions[b.GetBucket()] = b.GetRevision()
	}
	// 3 nodes x 4 modules: 10 needs (+2 malformed per node), 1 applied,
	// 3 items (+1 malformed per node); the first node's manifests of the
	// four providers.
	if diff := cmp.Diff(map[string]int{
		keys.RegistryBucket: 13, keys.NeedsBucket: 3*4*10 + 3*2, keys.AppliedBucket: 3 * 4, keys.CollectBucket: 3*4*3 + 3, keys.ManifestsBucket: 4,
	}, counts); diff != "" {
		t.Errorf("captured keys per bucket (-want +got):\n%s", diff)
	}
	if len(bound) == 0 {
		t.Error("the capture holds no provider's bucket")
	}

	replay, err := answers.NewReplay(capture)
	if err != nil {
		t.Fatal(err)
	}
	for _, node := range []string{"node-0000", "node-0002"} {
		// Composed once the live copy holds what was captured.
		live, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: &provisionerv1.Revisions{
			Registry: revisions[keys.RegistryBucket], Needs: revisions[keys.NeedsBucket], Collect: revisions[keys.CollectBucket], Applied: revisions[keys.AppliedBucket],
			Manifests: revisions[keys.ManifestsBucket], Bound: bound,
		}})
		if err != nil {
			t.Fatal(err)
		}
		if len(live.GetPlans()) != 4 || len(live.GetRefusals()) < 2 {
			t.Errorf("composition of %s: %d plans, %d refusals; want 4 plans and the malformed keys refused", node, len(live.GetPlans()), len(live.GetRefusals()))
		}
		var between, boundProvisions int
		for _, p := range live.GetPlans() {
			if p.GetWantedBuild() != p.GetNewestBuild() {
				between++
			}
		}
		for _, p := range live.GetProvisions() {
			if p.GetBoundRevision() > 0 && p.GetManifestDigest() != "" {
				boundProvisions++
			}
		}
		if between == 0 || boundProvisions == 0 {
			t.Errorf("composition of %s: %d modules between builds, %d provisions bound; want some of each", node, between, boundProvisions)
		}
		replayed, err := replay.Compose(&provisionerv1.ComposeRequest{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(live, replayed, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")); diff != "" {
			t.Errorf("%s composed from the capture (-live +replay):\n%s", node, diff)
		}
	}
}

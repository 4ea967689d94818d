package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// A node far over its budget holds no more than its budget in the copy,
// its excess is reported, and another node's answers do not change. The
// keys over it are written into the bucket directly, as keys written
// before the budget was lowered are: through the put verb, a write past
// the budget is refused before it is stored.
func TestNodeBudget(t *testing.T) {
	t.Parallel()
	const budget, written = 20, 400
	var logs syncBuffer
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc, func(c *service.Config) {
		c.NodeMaxKeys = budget
		c.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	novox, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "novox"})
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(nc)
	rev, err := novox.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	novoxBefore := askNeeds(ctx, t, c, "novox", rev)
	if len(novoxBefore.GetNeeds()) != 1 {
		t.Fatalf("novox's needs: %v, want its one", novoxBefore.GetNeeds())
	}

	var last uint64
	for i := range budget {
		if last, err = ace.PutNeed(ctx, "web", "port", fmt.Sprintf("p%03d", i), &provisionerv1.Need{Placeholder: "${port:x}"}); err != nil {
			t.Fatal(err)
		}
	}
	if !waitForCopy(ctx, c, "ace", last) {
		t.Fatal("the copy did not reach ace's last need")
	}
	if _, err := ace.PutNeed(ctx, "web", "port", "one-more", &provisionerv1.Need{Placeholder: "${port:x}"}); wire.CodeOf(err) != wire.CodeTooLarge || !strings.Contains(err.Error(), "--node-max-keys") {
		t.Fatalf("a put past the budget = %v, want a 413 naming --node-max-keys", err)
	}
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:x}"})
	for i := budget; i < written; i++ {
		if last, err = needs.Put(ctx, fmt.Sprintf("ace.web.port.p%03d", i), value); err != nil {
			t.Fatal(err)
		}
	}
	got := askNeeds(ctx, t, c, "ace", last)
	if len(got.GetNeeds()) != budget {
		t.Errorf("ace's needs answered: %d, want the budget's %d", len(got.GetNeeds()), budget)
	}
	// Listed over budget: a bounded number, each with a reason naming it.
	if n := len(got.GetMalformed()); n == 0 || n > 100 {
		t.Errorf("ace's keys over budget listed: %d, want 1 to 100", n)
	}
	for _, m := range got.GetMalformed() {
		if !strings.Contains(m.GetReason(), "over its budget of 20 keys") {
			t.Fatalf("malformed reason %q does not name the budget", m.GetReason())
		}
	}
	stats := endpointData(t, svc)
	var over []map[string]any
	if err := json.Unmarshal(stats["over_budget"], &over); err != nil || len(over) != 1 {
		t.Fatalf("stats over_budget = %s (%v), want ace alone", stats["over_budget"], err)
	}
	if over[0]["node"] != "ace" || over[0]["keys"] != float64(budget) || over[0]["refused"] != float64(written-budget) {
		t.Errorf("over_budget = %v, want ace holding %d keys with %d refused", over[0], budget, written-budget)
	}
	if diff := cmp.Diff(novoxBefore.GetNeeds(), askNeeds(ctx, t, c, "novox", last).GetNeeds(), protocmp.Transform()); diff != "" {
		t.Errorf("novox's answer changed (-before +after):\n%s", diff)
	}

	// ace deletes all but its budget: back under, said once.
	for i := budget; i < written; i++ {
		if _, err := ace.DeleteNeed(ctx, "web", "port", fmt.Sprintf("p%03d", i)); err != nil {
			t.Fatal(err)
		}
	}
	js, _ := nc.JetStream()
	info, err := js.StreamInfo("KV_" + keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	got = askNeeds(ctx, t, c, "ace", info.State.LastSeq)
	if len(got.GetNeeds()) != budget || len(got.GetMalformed()) != 0 {
		t.Errorf("after the deletes: %d needs and %d malformed, want %d and 0", len(got.GetNeeds()), len(got.GetMalformed()), budget)
	}
	if n := len(logs.lines(t, "node over its budget")); n != 1 {
		t.Errorf("%d warnings of ace over its budget, want 1", n)
	}
	if n := len(logs.lines(t, "node back within its budget")); n != 1 {
		t.Errorf("%d lines of ace back within its budget, want 1", n)
	}
}

// waitForCopy reports whether the copy reaches revision of the needs
// within ctx: node's needs are answered at it.
func waitForCopy(ctx context.Context, c *client.Client, node string, revision uint64) bool {
	_, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: node, MinRevision: revision})
	return err == nil
}

func askNeeds(ctx context.Context, t *testing.T, c *client.Client, node string, minRevision uint64) *provisionerv1.ProvisioningResponse {
	t.Helper()
	answer, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: node, MinRevision: minRevision})
	if err != nil {
		t.Fatal(err)
	}
	return answer
}

// endpointData returns the provisioning endpoint's stats data, field by
// field.
func endpointData(t *testing.T, svc *service.Service) map[string]json.RawMessage {
	t.Helper()
	var ep *micro.EndpointStats
	for _, e := range svc.Stats().Endpoints {
		if e.Name == "provisioning" {
			ep = e
		}
	}
	if ep == nil {
		t.Fatal("no provisioning endpoint in the stats")
	}
	var data map[string]json.RawMessage
	if err := json.Unmarshal(ep.Data, &data); err != nil {
		t.Fatal(err)
	}
	return data
}

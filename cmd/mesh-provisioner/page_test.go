package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/natstest"
	"github.com/novox/mesh-provisioner/internal/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// statusPageMesh runs serve --http on a NATS with two nodes' needs, one
// refused, and a malformed key, and returns the page's base URL and a
// connection to that NATS once the copy holds every write.
func statusPageMesh(t *testing.T) (string, *nats.Conn) {
	t.Helper()
	s := natstest.Start(t)
	return statusPageMeshOn(t, natstest.Connect(t, s), "--nats-url", s.ClientURL())
}

// statusPageMeshOn is statusPageMesh on a NATS that nc, an unrestricted
// connection, writes to, serve started with args.
func statusPageMeshOn(t *testing.T, nc *nats.Conn, args ...string) (string, *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	base := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	serveInProcess(t, append(args, "--http", strings.TrimPrefix(base, "http://")), nil)
	waitProbe(t, base+"/readyz", http.StatusOK, "ready", 20*time.Second)
	for _, node := range []string{"ace", "novox"} {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		for _, need := range []struct {
			module, kind, name string
			need               *provisionerv1.Need
		}{
			{"web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true}},
			{"web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "db", Local: "ro"}},
			{"web", "nosuchkind", "x", &provisionerv1.Need{Placeholder: "${nosuchkind:x}", Required: true}},
		} {
			if node == "novox" && need.kind == "nosuchkind" {
				continue
			}
			if _, err := c.PutNeed(ctx, need.module, need.kind, need.name, need.need); err != nil {
				t.Fatal(err)
			}
		}
	}
	last, err := servicetest.Bucket(t, nc, keys.NeedsBucket).Put(ctx, "ace.web.port", nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last}); err != nil {
		t.Fatal(err)
	}
	return base, nc
}

// checkPage checks what the status page shows (its HTML, as served or as a
// browser's DOM) against the service's own answers.
func checkPage(t *testing.T, page string, nc *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	cell := func(row, class string) (string, bool) {
		m := regexp.MustCompile(`(?s)<tr data-` + regexp.QuoteMeta(row) + `"[^>]*>.*?class="` + class + `">([^<]*)<`).FindStringSubmatch(page)
		if m == nil {
			return "", false
		}
		return strings.TrimSpace(m[1]), true
	}

	// The seat, as micro discovery reports it.
	msg, err := nc.Request("$SRV.STATS."+wire.ServiceName, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatal(err)
	}
	var data struct {
		Seat   string `json:"seat"`
		Holder string `json:"seat_holder"`
	}
	if err := json.Unmarshal(stats.Endpoints[0].Data, &data); err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf(`id="seat" data-seat="%s" data-holder="%s"`, data.Seat, data.Holder); data.Seat != "held" || !strings.Contains(page, want) {
		t.Errorf("the page does not show the seat as $SRV.STATS has it (%s)", want)
	}
	if !strings.Contains(page, `data-instance="`+stats.ID+`"`) {
		t.Errorf("the page does not list instance %s", stats.ID)
	}

	// The nodes, their needs, provisions and refusals, as the verbs answer.
	c := client.New(nc)
	needs, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS})
	if err != nil {
		t.Fatal(err)
	}
	perNode := map[string]int{}
	for _, n := range needs.GetNeeds() {
		perNode[n.GetNode()]++
	}
	if len(perNode) != 2 {
		t.Fatalf("the mesh has %d nodes, want 2", len(perNode))
	}
	for node, n := range perNode {
		composed, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		for class, want := range map[string]int{"needs": n, "provisions": len(composed.GetProvisions()), "refusals": len(composed.GetRefusals())} {
			got, ok := cell(`node="`+node, class)
			if first, _, _ := strings.Cut(got, " "); !ok || first != strconv.Itoa(want) {
				t.Errorf("node %s: the page shows %s %q, the verbs %d", node, class, got, want)
			}
		}
		got, _ := cell(`node="`+node, "refusals")
		for _, r := range composed.GetRefusals() {
			if reason := strings.TrimPrefix(r.GetReason().String(), "REFUSAL_REASON_"); !strings.Contains(got, reason+"=") {
				t.Errorf("node %s: the page's refusals %q do not name %s", node, got, reason)
			}
		}
		if !strings.Contains(page, `href="/nodes/`+node+`/compose"`) {
			t.Errorf("node %s has no link to its composition", node)
		}
	}

	// The malformed keys and the buckets' revisions.
	for _, m := range needs.GetMalformed() {
		if !strings.Contains(page, `data-key="`+m.GetKey()+`"`) {
			t.Errorf("the page does not list malformed key %s", m.GetKey())
		}
	}
	if got, _ := cell(`bucket="`+keys.NeedsBucket, "copy"); got != strconv.FormatUint(needs.GetRevision(), 10) {
		t.Errorf("the page shows the needs' copy at %q, the verb at %d", got, needs.GetRevision())
	}
	if got, _ := cell(`bucket="`+keys.NeedsBucket, "lag"); got != "0" {
		t.Errorf("the page shows the needs' lag %q, want 0", got)
	}
	if !strings.Contains(page, `<span class="ready">ready</span>`) {
		t.Error("the page does not say ready")
	}
}

// TestStatusPage checks the page as served, and a node's composition link;
// TestStatusPageInABrowser (build tag browser) checks it in chromium.
func TestStatusPage(t *testing.T) {
	t.Parallel()
	base, nc := statusPageMesh(t)
	code, page := probe(t, base+"/")
	if code != http.StatusOK {
		t.Fatalf("/: %d\n%s", code, page)
	}
	checkPage(t, page, nc)

	code, body := probe(t, base+"/nodes/ace/compose")
	var composed struct {
		Node     string            `json:"node"`
		Refusals []json.RawMessage `json:"refusals"`
	}
	if err := json.Unmarshal([]byte(body), &composed); code != http.StatusOK || err != nil || composed.Node != "ace" || len(composed.Refusals) == 0 {
		t.Errorf("/nodes/ace/compose: %d %v\n%s", code, err, body)
	}
	if code, body := probe(t, base+"/nodes/a%20b/compose"); code != http.StatusBadRequest || !strings.HasPrefix(body, "400: ") {
		t.Errorf("/nodes/a b/compose: %d %q, want 400: sentence", code, body)
	}
}

// TestStatusPageUnderTheGeneratedPermissions: on a nats-server whose
// authorization is what `permissions` prints, serve answering and writing as
// its two identities, the page reads the mesh as an operator's identity
// (--http-nats-url, --http-inbox-prefix) and shows what the service answers;
// /metrics reads each bucket's lag on the writer's connection.
func TestStatusPageUnderTheGeneratedPermissions(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	url := func(user string) string {
		return "nats://" + user + ":" + user + "-secret@" + strings.TrimPrefix(s.ClientURL(), "nats://")
	}
	admin := connectAs(t, s, "", "admin")
	base, nc := statusPageMeshOn(t, admin.nc, "--nats-url", url(wire.ServerIdentity), "--writer-nats-url", url(wire.WriterIdentity),
		"--http-nats-url", url("ops"), "--http-inbox-prefix", wire.InboxPrefix(wire.RoleOperator, "ops"))
	code, page := probe(t, base+"/")
	if code != http.StatusOK || strings.Contains(page, "could not be read") {
		t.Fatalf("/: %d\n%s", code, page)
	}
	checkPage(t, page, nc)
	if code, body := probe(t, base+"/metrics"); code != http.StatusOK || !strings.Contains(body, `mesh_provisioner_copy_lag_revisions{bucket="mesh-provisioner_needs"} 0`) {
		t.Errorf("/metrics: %d, want the needs copy's lag read as 0:\n%s", code, body)
	}
}

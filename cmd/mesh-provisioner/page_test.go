package main

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// statusPage is serve --http as a test reaches it: its base URL and the
// bearer token its --http-token-file holds.
type statusPage struct{ base, token string }

// get GETs path with the token, and returns the status and the body.
func (p statusPage) get(t *testing.T, path string) (int, string) {
	t.Helper()
	code, _, body := probeAs(t, p.base+path, "", p.token)
	return code, body
}

// writeTokenFile writes a fresh token, as --http-token-file takes it, to a
// file only its owner may read, and returns both.
func writeTokenFile(t *testing.T) (path, token string) {
	t.Helper()
	token = rand.Text()
	path = filepath.Join(t.TempDir(), "http-token")
	if err := os.WriteFile(path, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return path, token
}

// probeAs is probe with the request's Host header set to host (the URL's
// when empty) and token sent as a bearer credential (none when empty); it
// returns the answer's headers too.
func probeAs(t *testing.T, url, host, token string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if host != "" {
		req.Host = host
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := (&http.Client{Timeout: 2 * time.Second}).Do(req)
	if err != nil {
		return 0, nil, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// statusPageMesh runs serve --http on a NATS with two nodes' needs, one
// refused, and a malformed key, and returns the page and a connection to
// that NATS once the copy holds every write.
func statusPageMesh(t *testing.T) (statusPage, *nats.Conn) {
	t.Helper()
	s := natstest.Start(t)
	return statusPageMeshOn(t, natstest.Connect(t, s), "--nats-url", s.ClientURL())
}

// statusPageMeshOn is statusPageMesh on a NATS that nc, an unrestricted
// connection, writes to, serve started with args.
func statusPageMeshOn(t *testing.T, nc *nats.Conn, args ...string) (statusPage, *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	tokenFile, token := writeTokenFile(t)
	page := statusPage{base: "http://127.0.0.1:" + strconv.Itoa(freePort(t)), token: token}
	serveInProcess(t, append(args, "--http", strings.TrimPrefix(page.base, "http://"), "--http-token-file", tokenFile), nil)
	waitProbe(t, page.base+"/readyz", http.StatusOK, "ready", 20*time.Second)
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
	return page, nc
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
	page, nc := statusPageMesh(t)
	code, html := page.get(t, "/")
	if code != http.StatusOK {
		t.Fatalf("/: %d\n%s", code, html)
	}
	checkPage(t, html, nc)

	code, body := page.get(t, "/nodes/ace/compose")
	var composed struct {
		Node     string            `json:"node"`
		Refusals []json.RawMessage `json:"refusals"`
	}
	if err := json.Unmarshal([]byte(body), &composed); code != http.StatusOK || err != nil || composed.Node != "ace" || len(composed.Refusals) == 0 {
		t.Errorf("/nodes/ace/compose: %d %v\n%s", code, err, body)
	}
	if code, body := page.get(t, "/nodes/a%20b/compose"); code != http.StatusBadRequest || !strings.HasPrefix(body, "400: ") {
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
	page, nc := statusPageMeshOn(t, admin.nc, "--nats-url", url(wire.ServerIdentity), "--writer-nats-url", url(wire.WriterIdentity),
		"--http-nats-url", url("ops"), "--http-inbox-prefix", wire.InboxPrefix(wire.RoleOperator, "ops"))
	code, html := page.get(t, "/")
	if code != http.StatusOK || strings.Contains(html, "could not be read") {
		t.Fatalf("/: %d\n%s", code, html)
	}
	checkPage(t, html, nc)
	if code, body := page.get(t, "/metrics"); code != http.StatusOK || !strings.Contains(body, `mesh_provisioner_copy_lag_revisions{bucket="mesh-provisioner_needs"} 0`) {
		t.Errorf("/metrics: %d, want the needs copy's lag read as 0:\n%s", code, body)
	}
}

// TestStatusPageKeepsTheMeshsConfinement: whoever lacks the operator's
// token (a node refused bob's plan over NATS, say) cannot read that plan at
// /nodes/bob/compose either. serve --http :PORT
// listens on 127.0.0.1 only; the page, the node views and /metrics answer
// only a request to a name of --http-hosts carrying the token of
// --http-token-file (here from its variable), while the probes answer
// anyone, by any host; the token shows in no log line.
func TestStatusPageKeepsTheMeshsConfinement(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	tokenFile, token := writeTokenFile(t)
	port := strconv.Itoa(freePort(t))
	serving := serveInProcess(t, []string{"--nats-url", s.ClientURL(), "--http", ":" + port, "--http-hosts", "localhost, 127.0.0.1, mesh-provisioner.ops.example", "--log-format", "json"},
		map[string]string{"MESH_PROVISIONER_SERVE_HTTP_TOKEN_FILE": tokenFile})
	base := "http://127.0.0.1:" + port
	waitProbe(t, base+"/readyz", http.StatusOK, "ready", 20*time.Second)
	serving.log.waitFor(t, `"url":"http://127.0.0.1:`+port+`"`, time.Second)

	bob, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	written, err := bob.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: written}); err != nil {
		t.Fatal(err)
	}

	tests := []struct {
		name, path, host, token string
		code                    int
		says                    string
	}{
		{"page without the token", "/", "", "", http.StatusUnauthorized, "Authorization: Bearer <token>"},
		{"bob's plan without the token", "/nodes/bob/compose", "", "", http.StatusUnauthorized, "--http-token-file"},
		{"metrics without the token", "/metrics", "", "", http.StatusUnauthorized, "--http-token-file"},
		{"bob's plan with another token", "/nodes/bob/compose", "", rand.Text(), http.StatusUnauthorized, "--http-token-file"},
		{"page with the token", "/", "", token, http.StatusOK, "<h1>mesh-provisioner"},
		{"bob's plan with the token", "/nodes/bob/compose", "", token, http.StatusOK, `${port:http}`},
		{"metrics with the token", "/metrics", "", token, http.StatusOK, "mesh_provisioner_ready"},
		{"a name of --http-hosts", "/", "mesh-provisioner.ops.example:" + port, token, http.StatusOK, "<h1>mesh-provisioner"},
		{"a rebound name", "/", "evil.example:" + port, token, http.StatusMisdirectedRequest, "--http-hosts"},
		{"::1, not among --http-hosts", "/metrics", "[::1]:" + port, token, http.StatusMisdirectedRequest, "--http-hosts"},
		{"healthz for any host", "/healthz", "10.1.2.3:" + port, "", http.StatusOK, "ok"},
		{"readyz for any host", "/readyz", "10.1.2.3:" + port, "", http.StatusOK, "ready"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, header, body := probeAs(t, base+tt.path, tt.host, tt.token)
			if code != tt.code || !strings.Contains(body, tt.says) {
				t.Fatalf("%s (Host %q): %d %.200q, want %d saying %q", tt.path, tt.host, code, body, tt.code, tt.says)
			}
			if code == http.StatusUnauthorized && !strings.HasPrefix(header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 with WWW-Authenticate %q, want Bearer", header.Get("WWW-Authenticate"))
			}
		})
	}
	t.Cleanup(func() { // after the subtests
		if strings.Contains(serving.log.String(), token) {
			t.Errorf("the token shows in serve's log:\n%s", serving.log)
		}
	})
}

// TestStatusPageWithoutATokenFile: serve --http with no --http-token-file
// refuses the page, the node views and /metrics to everyone, naming the
// flag, and answers the probes.
func TestStatusPageWithoutATokenFile(t *testing.T) {
	t.Parallel()
	s := natstest.Start(t)
	base := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	serveInProcess(t, []string{"--nats-url", s.ClientURL(), "--http", strings.TrimPrefix(base, "http://")}, nil)
	waitProbe(t, base+"/readyz", http.StatusOK, "ready", 20*time.Second)
	for _, path := range []string{"/", "/nodes/bob/compose", "/metrics"} {
		if code, body := probe(t, base+path); code != http.StatusForbidden || !strings.Contains(body, "--http-token-file") {
			t.Errorf("%s: %d %.200q, want 403 naming --http-token-file", path, code, body)
		}
	}
	if code, body := probe(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz: %d %q, want 200", code, body)
	}
}

// TestHTTPTokenFileRefused: serve refuses to start, in one sentence that
// names the flag and not the token, with a token file it cannot use.
func TestHTTPTokenFileRefused(t *testing.T) {
	t.Parallel()
	const secret = "a-token-long-enough-to-be-taken"
	tests := []struct {
		name, content string
		mode          os.FileMode
		says          string
	}{
		{"empty", "", 0o600, "is empty"},
		{"readable by every user", secret + "\n", 0o644, "chmod o-r"},
		{"two tokens", secret + "\n" + secret + "\n", 0o600, "a line after the first"},
		{"missing", "", 0, "no such file"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "http-token")
			if tt.mode != 0 {
				if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
					t.Fatal(err)
				}
				if err := os.Chmod(path, tt.mode); err != nil { // past the umask
					t.Fatal(err)
				}
			}
			args := []string{"serve", "--http", "127.0.0.1:0", "--http-token-file", path, "--nats-url", "nats://127.0.0.1:1", "--connect-retry=false"}
			err := runWithEnv(t.Context(), args, envOf(nil), io.Discard, io.Discard)
			if err == nil || !strings.HasPrefix(err.Error(), "--http-token-file: ") || !strings.Contains(err.Error(), tt.says) || strings.Contains(err.Error(), secret) {
				t.Errorf("serve: %v, want an error from --http-token-file saying %q, without the token", err, tt.says)
			}
		})
	}
}

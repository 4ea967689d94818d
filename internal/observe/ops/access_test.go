package ops_test

import (
	"context"
	"errors"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/observe/ops"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/nodeclient"
)

// testToken is the bearer token the tests' servers are given.
const testToken = "t0ken-of-the-tests-0123456789abcdef"

// request GETs url with the Host header host (the URL's when empty) and
// token as a bearer credential (none when empty).
func request(t *testing.T, url, host, token string) (int, http.Header, string) {
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
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(body)
}

// startGuarded runs a service on a real NATS, with node bob's need in it,
// and an HTTP server for it given token (none when nil).
func startGuarded(t *testing.T, token []byte) *ops.Server {
	t.Helper()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	srv, err := ops.Start(context.WithoutCancel(ctx), ops.Config{Addr: "127.0.0.1:0", Token: token})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	svc := servicetest.Start(t, nc)
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{nc}, Ask: nc, Read: nc})
	bob, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "bob"})
	if err != nil {
		t.Fatal(err)
	}
	written, err := bob.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true})
	if err != nil {
		t.Fatal(err)
	}
	// Once the copy holds the need, the service is ready and stays so.
	if _, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: written}); err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestGuardedPathsNeedTheTokenAndOneOfTheHosts: the page, a node's
// composition and /metrics answer only a request to one of the server's
// hosts with its bearer token; /healthz and /readyz answer anyone, for any
// host.
func TestGuardedPathsNeedTheTokenAndOneOfTheHosts(t *testing.T) {
	t.Parallel()
	srv := startGuarded(t, []byte(testToken))
	port := srv.URL()[strings.LastIndex(srv.URL(), ":")+1:]
	tests := []struct {
		name, path, host, token string
		code                    int
		says                    string
	}{
		{"page without a token", "/", "", "", http.StatusUnauthorized, "Authorization: Bearer <token>"},
		{"another node's composition without a token", "/nodes/bob/compose", "", "", http.StatusUnauthorized, "--http-token-file"},
		{"metrics without a token", "/metrics", "", "", http.StatusUnauthorized, "--http-token-file"},
		{"an unknown path without a token", "/nodes", "", "", http.StatusUnauthorized, "--http-token-file"},
		{"page with a wrong token", "/", "", testToken + "x", http.StatusUnauthorized, "--http-token-file"},
		{"page with a prefix of the token", "/", "", testToken[:len(testToken)-1], http.StatusUnauthorized, "--http-token-file"},
		{"page with the token", "/", "", testToken, http.StatusOK, "<h1>mesh-provisioner"},
		{"composition with the token", "/nodes/bob/compose", "", testToken, http.StatusOK, `"bob"`},
		{"metrics with the token", "/metrics", "", testToken, http.StatusOK, "mesh_provisioner_ready 1"},
		{"an unknown path with the token", "/nodes", "", testToken, http.StatusNotFound, "404"},
		{"localhost in capitals", "/", "LOCALHOST:" + port, testToken, http.StatusOK, "<h1>mesh-provisioner"},
		{"::1", "/metrics", "[::1]:" + port, testToken, http.StatusOK, "mesh_provisioner_ready"},
		{"a foreign host with the token", "/", "evil.example:" + port, testToken, http.StatusMisdirectedRequest, "--http-hosts"},
		{"a foreign host's metrics", "/metrics", "evil.example", testToken, http.StatusMisdirectedRequest, "--http-hosts"},
		{"a foreign host without a token", "/nodes/bob/compose", "evil.example", "", http.StatusMisdirectedRequest, "--http-hosts"},
		{"healthz for anyone", "/healthz", "", "", http.StatusOK, "ok"},
		{"readyz for anyone", "/readyz", "", "", http.StatusOK, "ready"},
		{"healthz for the pod's IP", "/healthz", "10.1.2.3:" + port, "", http.StatusOK, "ok"},
		{"readyz for the pod's IP", "/readyz", "10.1.2.3:" + port, "", http.StatusOK, "ready"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			code, header, body := request(t, srv.URL()+tt.path, tt.host, tt.token)
			if code != tt.code || !strings.Contains(body, tt.says) {
				t.Fatalf("%s (Host %q): %d %.200q, want %d saying %q", tt.path, tt.host, code, body, tt.code, tt.says)
			}
			if code == http.StatusUnauthorized && !strings.HasPrefix(header.Get("WWW-Authenticate"), "Bearer") {
				t.Errorf("401 with WWW-Authenticate %q, want Bearer", header.Get("WWW-Authenticate"))
			}
			if code >= 400 && strings.Count(strings.TrimSpace(body), "\n") != 0 {
				t.Errorf("a refusal of more than one line: %q", body)
			}
		})
	}
}

// TestWithoutATokenNothingIsServed: a server given no token refuses the
// page, the node views and /metrics to everyone, saying which flag serves
// them, and still answers the probes.
func TestWithoutATokenNothingIsServed(t *testing.T) {
	t.Parallel()
	srv := startGuarded(t, nil)
	for _, tt := range []struct {
		name, path, token string
		code              int
		says              string
	}{
		{"page", "/", "", http.StatusForbidden, "--http-token-file"},
		{"composition", "/nodes/bob/compose", "", http.StatusForbidden, "--http-token-file"},
		{"metrics", "/metrics", "", http.StatusForbidden, "--http-token-file"},
		{"metrics with a token", "/metrics", testToken, http.StatusForbidden, "--http-token-file"},
		{"healthz", "/healthz", "", http.StatusOK, "ok"},
		{"readyz", "/readyz", "", http.StatusOK, "ready"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if code, _, body := request(t, srv.URL()+tt.path, "", tt.token); code != tt.code || !strings.Contains(body, tt.says) {
				t.Errorf("%s: %d %.200q, want %d saying %q", tt.path, code, body, tt.code, tt.says)
			}
		})
	}
}

// TestAnEmptyHostListensOnLoopback: ":port" listens on 127.0.0.1, not on
// every interface.
func TestAnEmptyHostListensOnLoopback(t *testing.T) {
	t.Parallel()
	srv, err := ops.Start(t.Context(), ops.Config{Addr: ":0", Token: []byte(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	if !strings.HasPrefix(srv.URL(), "http://127.0.0.1:") {
		t.Fatalf("--http :0 listens at %s, want 127.0.0.1", srv.URL())
	}
	port := srv.URL()[strings.LastIndex(srv.URL(), ":")+1:]
	if ip := nonLoopbackIPv4(t); ip != "" {
		if conn, err := net.Dial("tcp", net.JoinHostPort(ip, port)); err == nil {
			_ = conn.Close()
			t.Errorf("--http :0 answers on %s too", ip)
		}
	} else {
		t.Log("no address but loopback here: only the listener's address is checked")
	}
}

// nonLoopbackIPv4 returns one of this host's IPv4 addresses other than
// loopback, or "".
func nonLoopbackIPv4(t *testing.T) string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range addrs {
		if ipnet, ok := a.(*net.IPNet); ok && ipnet.IP.To4() != nil && !ipnet.IP.IsLoopback() {
			return ipnet.IP.String()
		}
	}
	return ""
}

func TestDefaultHosts(t *testing.T) {
	t.Parallel()
	loopback := []string{"localhost", "127.0.0.1", "::1"}
	tests := []struct {
		addr string
		want []string
	}{
		{":9090", loopback},
		{"127.0.0.1:9090", loopback},
		{"0.0.0.0:9090", loopback},
		{"[::]:9090", loopback},
		{"[::1]:9090", loopback},
		{"10.0.0.7:9090", append(slices.Clone(loopback), "10.0.0.7")},
		{"Ops.Example.:9090", append(slices.Clone(loopback), "ops.example")},
	}
	for _, tt := range tests {
		t.Run(tt.addr, func(t *testing.T) {
			t.Parallel()
			if got := ops.DefaultHosts(tt.addr); !slices.Equal(got, tt.want) {
				t.Errorf("DefaultHosts(%q) = %q, want %q", tt.addr, got, tt.want)
			}
		})
	}
}

// TestReadTokenFile: the token is the file's first line; a file that
// cannot hold a usable token, or that every user may read, is refused
// with a sentence that does not repeat its content.
func TestReadTokenFile(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		content string
		mode    os.FileMode
		want    string // the token, or the error's words
		refused bool
	}{
		{"trailing newline", testToken + "\n", 0o600, testToken, false},
		{"CRLF", testToken + "\r\n", 0o600, testToken, false},
		{"no newline, group-readable", testToken, 0o640, testToken, false},
		{"empty", "", 0o600, "is empty", true},
		{"a newline alone", "\n", 0o600, "is empty", true},
		{"short", "s3cret\n", 0o600, "at least 16", true},
		{"two lines", testToken + "\n" + testToken + "\n", 0o600, "a line after the first", true},
		{"a space", "t0ken with-a-space-in-it\n", 0o600, "a space", true},
		{"readable by every user", testToken + "\n", 0o644, "chmod o-r", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "token")
			if err := os.WriteFile(path, []byte(tt.content), tt.mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chmod(path, tt.mode); err != nil { // past the umask
				t.Fatal(err)
			}
			token, err := ops.ReadTokenFile(path)
			switch {
			case tt.refused && (err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), path)):
				t.Errorf("error %v, want one naming %s and saying %q", err, path, tt.want)
			case tt.refused && strings.TrimSpace(tt.content) != "" && strings.Contains(err.Error(), strings.TrimSpace(tt.content)):
				t.Errorf("the error shows the file's content: %v", err)
			case !tt.refused && (err != nil || string(token) != tt.want):
				t.Errorf("token %q, %v; want %q", token, err, tt.want)
			}
		})
	}
	if _, err := ops.ReadTokenFile(filepath.Join(t.TempDir(), "none")); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("a missing file: %v, want not exist", err)
	}
}

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

	"github.com/nats-io/nats-server/v2/server"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// TestServeWaitsForNATS starts serve while its NATS is down: it logs each
// attempt, serves soon after NATS comes up, and stops at once when NATS is
// gone.
func TestServeWaitsForNATS(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	s := serveInProcess(t, []string{"--nats-url", fmt.Sprintf("nats://127.0.0.1:%d", port), "--log-format", "json"}, nil)
	natstest.CheckFor(t, 10*time.Second, func() error {
		if n := strings.Count(s.log.String(), `"msg":"NATS not reachable; trying again shortly"`); n < 3 {
			return fmt.Errorf("%d attempts logged, want 3:\n%s", n, s.log)
		}
		return nil
	})
	select {
	case err := <-s.done:
		t.Fatalf("serve ended while NATS was down: %v", err)
	default:
	}
	nats := natstest.StartWithConfig(t, fmt.Sprintf("listen: 127.0.0.1:%d", port))
	up := time.Now()
	// The figure is logged, not bounded: under -race on a busy machine it
	// stretches; the wait's 10s is the bound.
	s.log.waitFor(t, `"msg":"serving"`, 10*time.Second)
	t.Logf("served %s after NATS came up", time.Since(up))
	for _, line := range strings.Split(strings.TrimSpace(s.log.String()), "\n") {
		if !json.Valid([]byte(line)) {
			t.Errorf("a line that is not slog's JSON: %s", line)
		}
	}

	// And when NATS goes away for good, serve still stops at once.
	nats.Shutdown()
	s.log.waitFor(t, `"msg":"disconnected from NATS; reconnecting"`, 10*time.Second)
	s.stop()
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("serve ended with %v", err)
		}
		s.done <- nil // for the cleanup
	case <-time.After(2 * time.Second):
		t.Errorf("serve still stopping 2s after it was told to, NATS being down:\n%s", s.log)
	}
}

// TestEmbeddedServerBannerAtDebug: nats-server's startup notices are debug
// lines of slog, not info.
func TestEmbeddedServerBannerAtDebug(t *testing.T) {
	t.Parallel()
	tests := []struct {
		level      string
		wantBanner bool
	}{
		{"info", false},
		{"debug", true},
	}
	for _, tt := range tests {
		t.Run(tt.level, func(t *testing.T) {
			t.Parallel()
			s := serveInProcess(t, []string{"--listen", "127.0.0.1:0", "--state-dir", t.TempDir(), "--log-format", "json", "--log-level", tt.level}, nil)
			s.log.waitFor(t, `"msg":"serving"`, 20*time.Second)
			banner := `"level":"DEBUG","msg":"Starting nats-server","component":"nats-server"`
			if got := strings.Contains(s.log.String(), banner); got != tt.wantBanner {
				t.Errorf("banner at debug logged: %v, want %v:\n%s", got, tt.wantBanner, s.log)
			}
			for _, line := range strings.Split(strings.TrimSpace(s.log.String()), "\n") {
				if strings.Contains(line, `"component":"nats-server"`) && strings.Contains(line, `"level":"INFO"`) {
					t.Errorf("nats-server logged at info while starting: %s", line)
				}
			}
		})
	}
}

// TestMadeUpProvidersAreAFewLogLines: node ace, with its own grant, writes
// 1,000 needs naming providers that do not exist. The writer looks for each
// provider's bucket, which its permissions refuse, 100 times a second: that
// is a metric's worth, and a few log lines a minute, not a line a look
// (issue 37: it was 112-121 ERROR lines a second).
func TestMadeUpProvidersAreAFewLogLines(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	host := strings.TrimPrefix(s.ClientURL(), "nats://")
	tokenFile, token := writeTokenFile(t)
	page := statusPage{base: "http://127.0.0.1:" + strconv.Itoa(freePort(t)), token: token}
	sv := serveInProcess(t, []string{
		"--nats-url", "nats://mesh-provisioner:mesh-provisioner-secret@" + host,
		"--writer-nats-url", "nats://mesh-provisioner-writer:mesh-provisioner-writer-secret@" + host,
		"--state-dir", t.TempDir(), "--log-format", "json",
		"--http", strings.TrimPrefix(page.base, "http://"), "--http-token-file", tokenFile,
	}, nil)
	sv.log.waitFor(t, `"msg":"serving"`, 20*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: connectAs(t, s, wire.RoleNode, "ace").nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	before := len(strings.Split(sv.log.String(), "\n"))
	for m := range 100 {
		needs := make([]nodeclient.ModuleNeed, 10)
		for i := range needs {
			provider := fmt.Sprintf("madeup%d", 10*m+i)
			needs[i] = nodeclient.ModuleNeed{Kind: "bound", Name: provider, Need: &provisionerv1.Need{
				Placeholder: "${bound:" + provider + "}", Provider: provider, Provision: "database", Local: "main"}}
		}
		if _, err := ace.ApplyNeeds(ctx, fmt.Sprintf("m%d", m), needs); err != nil {
			t.Fatal(err)
		}
	}
	// The writer's connection sends a message a look: wait for 300 of them
	// (three seconds of looks, each refused by nats-server).
	writerSent := func() int64 {
		connz, err := s.Connz(&server.ConnzOptions{Username: true})
		if err != nil {
			t.Fatal(err)
		}
		for _, c := range connz.Conns {
			if c.AuthorizedUser == wire.WriterIdentity {
				return c.InMsgs
			}
		}
		t.Fatal("no connection of the writer")
		return 0
	}
	sent := writerSent()
	natstest.CheckFor(t, 30*time.Second, func() error {
		if n := writerSent() - sent; n < 300 {
			return fmt.Errorf("the writer sent %d messages since the needs were written, want 300", n)
		}
		return nil
	})
	var lines []string
	for _, line := range strings.Split(sv.log.String(), "\n")[before-1:] {
		if strings.Contains(line, `"level":"WARN"`) || strings.Contains(line, `"level":"ERROR"`) {
			lines = append(lines, line)
		}
	}
	if len(lines) > 10 {
		t.Errorf("%d warnings and errors logged for 1,000 made-up providers, want at most 10:\n%s", len(lines), strings.Join(lines[:10], "\n"))
	}
	t.Logf("%d warnings and errors for 1,000 made-up providers:\n%s", len(lines), strings.Join(lines, "\n"))

	// Each refused look-up is counted instead, by identity.
	code, metrics := page.get(t, "/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d %s", code, metrics)
	}
	counted := regexp.MustCompile(`mesh_provisioner_permission_violations_total\{identity="` + wire.WriterIdentity + `"\} (\d+)`).FindStringSubmatch(metrics)
	if len(counted) < 2 {
		t.Fatalf("no mesh_provisioner_permission_violations_total of the writer in /metrics")
	}
	if n, _ := strconv.Atoi(counted[1]); n < 300 {
		t.Errorf("the writer's refused look-ups counted %d, want at least 300", n)
	}
}

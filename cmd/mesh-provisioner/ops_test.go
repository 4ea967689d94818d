package main

import (
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
)

// probe returns an HTTP GET's status and body; status 0 when nothing
// answered.
func probe(t *testing.T, url string) (int, string) {
	t.Helper()
	c := &http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get(url)
	if err != nil {
		return 0, err.Error()
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// waitProbe waits until url answers status with a body that holds want,
// and returns how long that took.
func waitProbe(t *testing.T, url string, status int, want string, within time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	natstest.CheckFor(t, within, func() error {
		if code, body := probe(t, url); code != status || !strings.Contains(body, want) {
			return fmt.Errorf("%s: %d %q, want %d with %q", url, code, body, status, want)
		}
		return nil
	})
	return time.Since(start)
}

// TestProbesFlipWithNATS: /healthz answers while the process runs; /readyz
// answers 200 only while the service serves with NATS connected, 503 saying
// why when NATS goes away, and 200 again once it is back.
func TestProbesFlipWithNATS(t *testing.T) {
	t.Parallel()
	nats := natstest.StartCluster(t, 1) // a fixed address, and a server that can be stopped and started on its store
	base := "http://127.0.0.1:" + strconv.Itoa(freePort(t))
	tokenFile, token := writeTokenFile(t)
	s := serveInProcess(t, []string{"--nats-url", nats.URL(0), "--http", strings.TrimPrefix(base, "http://"), "--http-token-file", tokenFile, "--log-format", "json"}, nil)

	waitProbe(t, base+"/healthz", http.StatusOK, "ok", 10*time.Second)
	took := waitProbe(t, base+"/readyz", http.StatusOK, "ready", 20*time.Second)
	s.log.waitFor(t, `"msg":"serving"`, time.Second)
	t.Logf("ready %s after /healthz answered", took)

	nats.Stop(0)
	took = waitProbe(t, base+"/readyz", http.StatusServiceUnavailable, "not ready: NATS is not connected", 5*time.Second)
	t.Logf("/readyz said 503 %s after NATS stopped", took)
	if code, body := probe(t, base+"/healthz"); code != http.StatusOK {
		t.Errorf("/healthz answered %d %q while NATS was down, want 200: the process runs", code, body)
	}
	if code, _, body := probeAs(t, base+"/metrics", "", token); code != http.StatusOK || !strings.Contains(body, "mesh_provisioner_ready 0") {
		t.Errorf("/metrics while NATS was down: %d, want 200 with mesh_provisioner_ready 0:\n%s", code, body)
	}

	nats.Start(0)
	took = waitProbe(t, base+"/readyz", http.StatusOK, "ready", 20*time.Second)
	t.Logf("/readyz said 200 again %s after NATS came back", took)

	s.stop()
	select {
	case err := <-s.done:
		if err != nil {
			t.Errorf("serve ended with %v", err)
		}
		s.done <- nil // for the cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("serve still running 10s after it was stopped")
	}
	if code, _ := probe(t, base+"/healthz"); code != 0 {
		t.Errorf("/healthz answered %d after serve ended; want nothing listening", code)
	}
}

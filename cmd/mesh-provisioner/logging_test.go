package main

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/novox/mesh-provisioner/internal/natstest"
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

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// The passwords are distinctive so that any trace of them shows.
const (
	servePassword = "s3rve-PASSWORD-never-logged"
	wrongPassword = "wr0ng-PASSWORD-never-logged"
)

// TestNoPasswordInAnyLogLineOrError runs serve against a NATS that requires
// a password given in --nats-url: it serves, is disconnected and
// reconnects, and also fails to connect with a wrong one; query fails the
// same way. Not one line of the log, nor any error, holds either password,
// and every line of the log is slog's JSON.
func TestNoPasswordInAnyLogLineOrError(t *testing.T) {
	t.Parallel()
	s := natstest.StartWithConfig(t, fmt.Sprintf(`
authorization {
  users = [
    { user: "mesh-provisioner", password: %q, permissions: %s }
    { user: "mesh-provisioner-writer", password: %q, permissions: %s }
  ]
}`, servePassword, printed(t, "--server"), servePassword, printed(t, "--server-writer")))
	hostPort := strings.TrimPrefix(s.ClientURL(), "nats://")
	goodURL := "nats://mesh-provisioner:" + servePassword + "@" + hostPort
	wrongURL := "nats://mesh-provisioner:" + wrongPassword + "@" + hostPort
	writerURL := "nats://mesh-provisioner-writer:" + servePassword + "@" + hostPort

	var captured []string // every log line and error
	capture := func(what string, text string) {
		for line := range strings.SplitSeq(strings.TrimSpace(text), "\n") {
			if line != "" {
				captured = append(captured, what+": "+line)
			}
		}
	}

	// Serving, disconnected by the server, reconnected.
	serving := serveInProcess(t, []string{"--nats-url", goodURL, "--writer-nats-url", writerURL, "--log-format", "json", "--log-level", "debug"}, nil)
	serving.log.waitFor(t, `"msg":"serving"`, 20*time.Second)
	if !strings.Contains(serving.log.String(), `"nats_url":"nats://mesh-provisioner:xxxxx@`+hostPort+`"`) {
		t.Errorf("the serving line does not show the URL redacted:\n%s", serving.log)
	}
	kickClient(t, s, wire.ServerIdentity)
	serving.log.waitFor(t, `"msg":"disconnected from NATS; reconnecting"`, 10*time.Second)
	serving.log.waitFor(t, `"msg":"reconnected to NATS"`, 10*time.Second)
	serving.stop()
	if err := <-serving.done; err != nil {
		t.Errorf("serve ended with %v", err)
	}
	serving.done <- nil // for the cleanup
	capture("serve log", serving.log.String())

	// A wrong password: at once, and after retrying.
	for _, args := range [][]string{
		{"serve", "--nats-url", wrongURL, "--connect-retry=false", "--log-format", "json", "--log-level", "debug"},
		{"serve", "--nats-url", wrongURL, "--log-format", "json", "--log-level", "debug"},
		{"serve", "--nats-url", wrongURL + "," + goodURL, "--connect-retry=false", "--log-format", "json", "--log-level", "debug", "--ready-timeout", "1ns"},
		{"query", "registry", "--nats-url", wrongURL, "--log-format", "json", "--log-level", "debug"},
		{"status", "--nats-url", goodURL, "--log-format", "json", "--log-level", "debug", "--timeout", "1s"},
	} {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		var stdout, stderr bytes.Buffer
		err := runWithEnv(ctx, args, envOf(nil), &stdout, &stderr)
		cancel()
		if err == nil {
			t.Errorf("%s with a wrong password or no service succeeded", args[0])
		} else {
			capture(args[0]+" error", err.Error())
		}
		capture(args[0]+" log", stderr.String())
		capture(args[0]+" output", stdout.String())
	}

	t.Logf("captured:\n%s", strings.Join(captured, "\n"))
	if len(captured) < 10 {
		t.Fatalf("captured only %d lines: %q", len(captured), captured)
	}
	for _, line := range captured {
		if strings.Contains(line, servePassword) || strings.Contains(line, wrongPassword) {
			t.Errorf("a password shows in %s", line)
		}
		if what, text, _ := strings.Cut(line, ": "); strings.HasSuffix(what, " log") && !json.Valid([]byte(text)) {
			t.Errorf("%s holds a line that is not slog's JSON: %s", what, text)
		}
	}
}

// kickClient disconnects the client connected under name, as a NATS server
// restart or a network fault would.
func kickClient(t *testing.T, s *server.Server, name string) {
	t.Helper()
	connz, err := s.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range connz.Conns {
		if c.Name == name {
			if err := s.DisconnectClientByID(c.Cid); err != nil {
				t.Fatal(err)
			}
			return
		}
	}
	t.Fatalf("no client named %s among %d", name, len(connz.Conns))
}

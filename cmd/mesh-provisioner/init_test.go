package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/novox/mesh-provisioner/wire"
)

// natsBinVariable names the natscli binary the end-to-end test runs (make
// test-go builds it: make nats).
const natsBinVariable = "MESH_PROVISIONER_NATS_BIN"

// From nothing to a secured mesh with the files init writes alone: the
// nats-server started with its configuration, the service with its two
// contexts, ace writing and composing with its context only (natscli too),
// ace refused bob's plan, alice's status, and check passing, then naming
// the missing grant when the writer's context is left out.
func TestInitWritesAMeshThatServes(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "mesh")
	natsURL := "nats://127.0.0.1:" + strconv.Itoa(freePort(t))
	cli := func(t *testing.T, env map[string]string, args ...string) (string, error) {
		t.Helper()
		// Its own log's writes may outlive it a moment (nats.go's events).
		var out, errOut syncBuffer
		ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
		defer cancel()
		err := runWithEnv(ctx, args, envOf(env), &out, &errOut)
		return out.String() + errOut.String(), err
	}
	if out, err := cli(t, nil, "init", dir, "--nodes", "ace,bob", "--providers", "pg", "--operators", "alice", "--hosts", "ace:pg", "--url", natsURL, "--partitions", "4"); err != nil {
		t.Fatalf("init: %v\n%s", err, out)
	}
	// Again on the same directory: refused for another URL, and one more
	// node added with every key kept.
	aceKey, _ := os.ReadFile(filepath.Join(dir, "keys", "node-ace.nk"))
	if _, err := cli(t, nil, "init", dir, "--nodes", "carol", "--url", "nats://127.0.0.1:1"); err == nil {
		t.Error("init for another URL on the same directory: want it refused")
	}
	if out, err := cli(t, nil, "init", dir, "--nodes", "carol"); err != nil {
		t.Fatalf("init adding carol: %v\n%s", err, out)
	}
	if again, _ := os.ReadFile(filepath.Join(dir, "keys", "node-ace.nk")); !bytes.Equal(again, aceKey) || len(aceKey) == 0 {
		t.Error("init adding a node changed ace's key")
	}
	other := t.TempDir()
	_ = os.WriteFile(filepath.Join(other, "notes.txt"), []byte("mine"), 0o600)
	if _, err := cli(t, nil, "init", other, "--nodes", "ace"); err == nil {
		t.Error("init into a directory holding other files: want it refused without --force")
	}
	conf, _ := os.ReadFile(filepath.Join(dir, "nats-server.conf"))
	if strings.Contains(strings.ToLower(string(conf)), "password") {
		t.Error("nats-server.conf holds a password")
	}
	// The mesh is split into 4 partitions: the mappings, each grant of
	// its own partition, and serve told so.
	readme, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	if !strings.Contains(string(conf), "{{partition(4,1)}}") || !strings.Contains(string(readme), "serve --context") || !strings.Contains(string(readme), "--partitions 4") {
		t.Error("init --partitions 4 wrote no mappings in nats-server.conf, or no serve --partitions 4 in README.md")
	}

	startInitServer(t, dir)
	context := func(file string) string { return filepath.Join(dir, "contexts", file+".json") }

	// Before serve: check passes (the buckets and the seat are serve's to
	// make), and names the writer's grant without the writer's context.
	out, err := cli(t, nil, "check", "--context", context("server"), "--writer-context", context("server-writer"))
	if err != nil || strings.Contains(out, "FAIL") {
		t.Fatalf("check with both contexts: %v\n%s", err, out)
	}
	t.Logf("check before serve:\n%s", out)
	out, err = cli(t, nil, "check", "--context", context("server"))
	if err == nil || !strings.Contains(out, "FAIL  the writer's grant") || !strings.Contains(out, "--writer-context") {
		t.Errorf("check without the writer's context: %v, want a FAIL naming the writer's grant and --writer-context:\n%s", err, out)
	}
	t.Logf("check without the writer's context:\n%s", out)

	tokenFile, token := writeTokenFile(t)
	page := statusPage{base: "http://127.0.0.1:" + strconv.Itoa(freePort(t)), token: token}
	sv := serveInProcess(t, []string{"--context", context("server"), "--writer-context", context("server-writer"), "--partitions", "4",
		"--http", strings.TrimPrefix(page.base, "http://"), "--http-token-file", tokenFile, "--http-context", context("operator-alice"),
		"--state-dir", t.TempDir(), "--log-format", "json"}, nil)
	sv.log.waitFor(t, `"msg":"serving"`, 30*time.Second)
	// The status page reads the mesh as alice, with her context alone.
	if code, body := page.get(t, "/"); code != 200 || strings.Contains(body, `id="refused"`) {
		t.Errorf("the status page as alice (--http-context): %d, refused: %v", code, strings.Contains(body, `id="refused"`))
	}

	ace := context("node-ace")
	if out, err := cli(t, nil, "put", "need", "--context", ace, "--node", "ace", "--module", "web", "--placeholder", "${port:http}"); err != nil {
		t.Fatalf("put as ace with its context: %v\n%s", err, out)
	}
	out, err = cli(t, nil, "query", "compose", "--context", ace, "--node", "ace", "--json")
	if err != nil || !strings.Contains(out, "${port:http}") {
		t.Fatalf("query compose as ace with its context: %v\n%s", err, out)
	}
	if out, err := cli(t, nil, "query", "compose", "--context", ace, "--node", "bob"); err == nil {
		t.Errorf("ace asking bob's plan: want it refused, got\n%s", out)
	}
	// $NATS_CONTEXT, as natscli reads it, does as --context does.
	if out, err := cli(t, map[string]string{"NATS_CONTEXT": ace}, "query", "needs", "--node", "ace", "--json"); err != nil || !strings.Contains(out, "${port:http}") {
		t.Errorf("query needs as ace with $NATS_CONTEXT: %v\n%s", err, out)
	}
	if out, err := cli(t, nil, "status", "--context", context("operator-alice")); err != nil {
		t.Errorf("status as alice with her context: %v\n%s", err, out)
	}
	out, err = cli(t, nil, "check", "--context", context("server"), "--writer-context", context("server-writer"))
	if err != nil || !strings.Contains(out, "ok    the seat: held by instance") {
		t.Errorf("check beside a serving instance: %v, want it to pass and name the seat's holder:\n%s", err, out)
	}

	t.Run("natscli reads ace's records through the service with ace's context", func(t *testing.T) {
		t.Parallel()
		natsBin := os.Getenv(natsBinVariable)
		if natsBin == "" {
			t.Skipf("$%s is not set (make test-go sets it)", natsBinVariable)
		}
		// Copied where natscli keeps contexts, under a home of the test's.
		home := t.TempDir()
		contextDir := filepath.Join(home, "nats", "context")
		if err := os.MkdirAll(contextDir, 0o700); err != nil {
			t.Fatal(err)
		}
		data, err := os.ReadFile(ace)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(contextDir, "node-ace.json"), data, 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.CommandContext(t.Context(), natsBin, "--context", "node-ace", "request", "--timeout", "5s",
			wire.NodeSubject(wire.ProvisioningSubject, "ace"), `{"what":"WHAT_NEEDS","node":"ace"}`, "--header", "Content-Type:"+wire.ContentTypeJSON)
		cmd.Env = append(os.Environ(), "XDG_CONFIG_HOME="+home, "HOME="+home)
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "port:http") {
			t.Errorf("nats --context node-ace request: %v\n%s", err, out)
		}
	})
}

// startInitServer starts the nats-server of the configuration init wrote in
// dir, stopped at the test's end.
func startInitServer(t *testing.T, dir string) *server.Server {
	t.Helper()
	opts, err := server.ProcessConfigFile(filepath.Join(dir, "nats-server.conf"))
	if err != nil {
		t.Fatal(err)
	}
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(ns.Shutdown)
	if !ns.ReadyForConnections(10 * time.Second) {
		t.Fatal("the nats-server of init's configuration did not start")
	}
	return ns
}

// initMesh writes a mesh of node ace with init into a directory of the
// test's, and starts its nats-server; it returns the directory.
func initMesh(t *testing.T) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "mesh")
	var out bytes.Buffer
	if err := runWithEnv(t.Context(), []string{"init", dir, "--nodes", "ace", "--url", "nats://127.0.0.1:" + strconv.Itoa(freePort(t))}, envOf(nil), &out, &out); err != nil {
		t.Fatalf("init: %v\n%s", err, out.String())
	}
	startInitServer(t, dir)
	return dir
}

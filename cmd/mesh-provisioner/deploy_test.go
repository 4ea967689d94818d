package main

import (
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// unitOfDeployDoc returns the systemd unit docs/deploy.md gives.
func unitOfDeployDoc(t *testing.T) string {
	t.Helper()
	doc, err := os.ReadFile("../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(doc), "```ini\n")
	unit, _, closed := strings.Cut(after, "```")
	if !ok || !closed {
		t.Fatal("docs/deploy.md has no ```ini block: the systemd unit")
	}
	return unit
}

// TestDeployUnit exercises the unit of docs/deploy.md: systemd-analyze
// verify, where it exists, and its ExecStart run with its Environment= and a
// NOTIFY_SOCKET, as systemd runs a unit of Type=notify.
func TestDeployUnit(t *testing.T) {
	t.Parallel()
	unit := unitOfDeployDoc(t)
	var execStart []string
	env := map[string]string{}
	credentials := map[string]bool{} // the names LoadCredential= gives
	for line := range strings.Lines(unit) {
		key, value, _ := strings.Cut(strings.TrimSpace(line), "=")
		switch key {
		case "Type":
			if value != "notify" {
				t.Errorf("Type=%s, want notify: serve notifies systemd", value)
			}
		case "ExecStart":
			execStart = strings.Fields(value)
		case "Environment":
			name, v, _ := strings.Cut(value, "=")
			env[name] = v
		case "LoadCredential":
			name, _, _ := strings.Cut(value, ":")
			credentials[name] = true
		}
	}
	if len(execStart) == 0 || env["MESH_PROVISIONER_SERVE_HTTP"] == "" {
		t.Fatalf("the unit has no ExecStart or no MESH_PROVISIONER_SERVE_HTTP:\n%s", unit)
	}
	// The page and /metrics are served only with a token: the unit gives
	// one, from systemd's credentials directory (%d).
	if credential, ok := strings.CutPrefix(env["MESH_PROVISIONER_SERVE_HTTP_TOKEN_FILE"], "%d/"); !ok || !credentials[credential] {
		t.Fatalf("the unit's MESH_PROVISIONER_SERVE_HTTP_TOKEN_FILE is not %%d/<a LoadCredential= name>:\n%s", unit)
	}

	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		file := filepath.Join(t.TempDir(), "mesh-provisioner.service")
		written := strings.Replace(unit, "ExecStart="+execStart[0], "ExecStart="+binary, 1)
		if err := os.WriteFile(file, []byte(written), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", file).CombinedOutput()
		if err != nil || strings.Contains(string(out), "mesh-provisioner.service") {
			t.Errorf("systemd-analyze verify: %v\n%s", err, out)
		}
	} else {
		t.Log("no systemd-analyze here: the unit is only run, not verified")
	}

	// systemd's side of Type=notify: a datagram socket named by NOTIFY_SOCKET.
	socket := filepath.Join(t.TempDir(), "notify")
	conn, err := net.ListenUnixgram("unixgram", &net.UnixAddr{Name: socket, Net: "unixgram"})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = conn.Close() }()
	notified := make(chan string, 4)
	go func() {
		buf := make([]byte, 4096)
		for {
			n, err := conn.Read(buf)
			if err != nil {
				close(notified)
				return
			}
			notified <- string(buf[:n])
		}
	}()

	// The unit's contexts are init's: the test's own mesh, written so.
	mesh := initMesh(t)
	env["MESH_PROVISIONER_SERVE_CONTEXT"] = filepath.Join(mesh, "contexts", "server.json")
	env["MESH_PROVISIONER_SERVE_WRITER_CONTEXT"] = filepath.Join(mesh, "contexts", "server-writer.json")
	base := "127.0.0.1:" + strconv.Itoa(freePort(t))
	env["MESH_PROVISIONER_SERVE_HTTP"] = base
	env["MESH_PROVISIONER_SERVE_STATE_DIR"] = t.TempDir()
	tokenFile, token := writeTokenFile(t)
	env["MESH_PROVISIONER_SERVE_HTTP_TOKEN_FILE"] = tokenFile // what systemd would copy to %d
	cmd := exec.Command(binary, execStart[1:]...)
	cmd.Env = []string{"NOTIFY_SOCKET=" + socket, "HOME=" + t.TempDir()}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr syncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	select {
	case got := <-notified:
		if got != "READY=1" {
			t.Fatalf("first notification %q, want READY=1", got)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("no READY=1 within 30s:\n%s", stderr.String())
	}
	if code, body := probe(t, "http://"+base+"/readyz"); code != http.StatusOK {
		t.Errorf("/readyz after READY=1: %d %q, want 200", code, body)
	}
	for _, tt := range []struct {
		token string
		code  int
	}{{"", http.StatusUnauthorized}, {token, http.StatusOK}} {
		if code, _, body := probeAs(t, "http://"+base+"/metrics", "", tt.token); code != tt.code {
			t.Errorf("/metrics with token %t: %d %q, want %d", tt.token != "", code, body, tt.code)
		}
	}
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-notified:
		if got != "STOPPING=1" {
			t.Errorf("notification after SIGTERM %q, want STOPPING=1", got)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("no STOPPING=1 within 10s of SIGTERM:\n%s", stderr.String())
	}
	if err := cmd.Wait(); err != nil {
		t.Errorf("serve ended with %v:\n%s", err, stderr.String())
	}
	if !strings.Contains(stderr.String(), `"msg":"serving"`) {
		t.Errorf("no JSON log (MESH_PROVISIONER_SERVE_LOG_FORMAT=json of the unit):\n%s", stderr.String())
	}
}

//go:build unix

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

func TestStateDirLockIsExclusiveAndNamesItsHolder(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, err := lockStateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	// flock locks an open file, not a process: a second open in this very
	// process is refused as another process's would be.
	_, err = lockStateDir(dir)
	if !errors.Is(err, ErrStateDirInUse) {
		t.Fatalf("second lock: %v, want ErrStateDirInUse", err)
	}
	for _, want := range []string{dir, fmt.Sprintf("process %d holds the lock", os.Getpid())} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not name %q", err, want)
		}
	}
	first.release()
	again, err := lockStateDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.release()
}

// startServing runs the binary serving on an embedded NATS and returns once
// it logs "serving", with its URL.
func startServing(t *testing.T, stateDir string) (*exec.Cmd, string) {
	t.Helper()
	port := freePort(t)
	cmd := serveBinary(t, []string{"--listen", "127.0.0.1:" + strconv.Itoa(port), "--state-dir", stateDir, "--log-format", "json"}, nil)
	return cmd, "nats://127.0.0.1:" + strconv.Itoa(port)
}

func answersRegistry(t *testing.T, url string) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{}); err != nil {
		t.Fatalf("the instance at %s does not answer: %v", url, err)
	}
}

func TestOneInstancePerStateDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	first, url := startServing(t, dir)

	// The second instance refuses, it does not wait for the lock, which
	// the first holds for good: it must exit by itself, which it does
	// within milliseconds; one still running after 20s is killed, and
	// fails the test.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	second := exec.CommandContext(ctx, binary, "--listen", "127.0.0.1:"+strconv.Itoa(freePort(t)), "--state-dir", dir)
	out, err := second.CombinedOutput()
	if ctx.Err() != nil {
		t.Fatalf("second instance still running after 20s, want an exit at once: %v\n%s", err, out)
	}
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("second instance: %v, want a non-zero exit\n%s", err, out)
	}
	text := strings.TrimSpace(string(out))
	want := fmt.Sprintf("mesh-provisioner: the state directory is in use: process %d holds the lock of --state-dir %s;", first.Process.Pid, dir)
	if strings.Contains(text, "\n") || !strings.HasPrefix(text, want) {
		t.Errorf("second instance said %q, want one line starting %q", text, want)
	}
	answersRegistry(t, url) // the first keeps serving

	// A lock file left behind by a process that died holding the lock does
	// not block: the kernel released the lock with the process.
	if err := first.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = first.Wait()
	if pid, err := os.ReadFile(filepath.Join(dir, lockFileName)); err != nil || strings.TrimSpace(string(pid)) != strconv.Itoa(first.Process.Pid) {
		t.Fatalf("lock file left behind holds %q (%v), want the dead PID %d", pid, err, first.Process.Pid)
	}
	_, url = startServing(t, dir)
	answersRegistry(t, url)
}

package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
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
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/registry"
)

// binary is the command, built once for the tests that run it as a process.
var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "mesh-provisioner-test")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "mesh-provisioner")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		_ = os.RemoveAll(dir)
		panic(fmt.Sprintf("go build: %v\n%s", err, out))
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = l.Close() }()
	return l.Addr().(*net.TCPAddr).Port
}

func TestBinaryServesAndStopsOnSIGTERM(t *testing.T) {
	t.Parallel()
	port := freePort(t)
	cmd := exec.Command(binary, "--listen", "127.0.0.1:"+strconv.Itoa(port), "--log-format", "json")
	cmd.Env = append(os.Environ(), "MESH_PROVISIONER_SERVE_STATE_DIR="+t.TempDir())
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(stderr)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
	}()
	waitForLine(t, lines, `"msg":"serving"`)

	nc, err := nats.Connect("nats://127.0.0.1:" + strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	// The reconciler writes the registry beside the service: it shows
	// shortly after serving begins.
	natstest.CheckFor(t, 5*time.Second, func() error {
		answer, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(answer.GetRegistry()), len(registry.Table()); got != want {
			return fmt.Errorf("registry answered %d entries, want %d", got, want)
		}
		return nil
	})

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	waitForLine(t, lines, `"msg":"shutting down`)
	for range lines { // drain until the process closes stderr
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("exit after SIGTERM: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("still running 15s after SIGTERM")
	}
}

// serveBinary runs the built binary with args, and env beside the test's
// own, and returns once it logs "serving" (with --log-format json); its
// further output is read and dropped, so that the pipe keeps flowing.
func serveBinary(t *testing.T, args, env []string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	lines := make(chan string, 100)
	go func() {
		defer close(lines)
		scanner := bufio.NewScanner(stderr)
		for scanner.Scan() {
			lines <- scanner.Text()
		}
	}()
	waitForLine(t, lines, `"msg":"serving"`)
	go func() {
		for range lines { // keep the pipe flowing
		}
	}()
	return cmd
}

func waitForLine(t *testing.T, lines <-chan string, want string) {
	t.Helper()
	deadline := time.After(20 * time.Second)
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("output ended before a line with %s", want)
			}
			if strings.Contains(line, want) {
				return
			}
		case <-deadline:
			t.Fatalf("no line with %s in 20s", want)
		}
	}
}

func TestBadSettingsExitWithOneLine(t *testing.T) {
	t.Parallel()
	occupied, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = occupied.Close() })
	tests := []struct {
		name string
		args []string
		env  []string
		says string
	}{
		{"listen address in use", []string{"--listen", occupied.Addr().String()}, nil, "--listen " + occupied.Addr().String() + ": the listen address is in use"},
		{"unreachable NATS", []string{"--nats-url", "nats://127.0.0.1:" + strconv.Itoa(freePort(t)), "--connect-retry=false"}, nil, "cannot reach NATS at nats://127.0.0.1:"},
		{"NATS without JetStream", []string{"--nats-url", natstest.StartWithoutJetStream(t).ClientURL()}, nil, "JetStream is not enabled on this NATS at nats://127.0.0.1:"},
		{"bad log format", []string{"--log-format", "xml"}, nil, `--log-format "xml": use text or json`},
		{"bad listen", []string{"--listen", "nowhere"}, nil, `--listen "nowhere": want host:port`},
		{"bad replicas", []string{"--replicas", "0"}, nil, "--replicas 0: use 1 to 5"},
		{"expecting without auto", []string{"--partitions", "4", "--hold", "0-3", "--hold-expect", "2"}, nil, "--hold-expect 2: give 0 or more, and more than 0 only with --hold auto"},
		{"page too small", nil, []string{"MESH_PROVISIONER_SERVE_PAGE_MAX_BYTES=100"}, "--page-max-bytes 100: use at least 4096"},
		{"bad variable", nil, []string{"MESH_PROVISIONER_SERVE_REGISTRY_INTERVAL=often"}, `$MESH_PROVISIONER_SERVE_REGISTRY_INTERVAL="often"`},
		{"unknown command", []string{"frobnicate"}, nil, `unknown command "frobnicate"`},
		{"stray argument", []string{"serve", "--replicas", "1", "extra"}, nil, `unexpected argument "extra"`},
		{"not a number", []string{"--replicas", "three"}, nil, `invalid value "three" for flag -replicas`},
		{"unknown flag", []string{"query", "--colour"}, nil, "flag provided but not defined: -colour; run with --help"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// A bad setting is refused, not retried: the process must exit
			// by itself, which it does within milliseconds; one still
			// running after 20s is killed, and fails the test.
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, binary, tt.args...)
			cmd.Env = append(os.Environ(), tt.env...)
			cmd.Env = append(cmd.Env, "MESH_PROVISIONER_SERVE_STATE_DIR="+t.TempDir())
			out, err := cmd.CombinedOutput()
			if ctx.Err() != nil {
				t.Fatalf("still running after 20s, want an exit at once: %v\n%s", err, out)
			}
			var exit *exec.ExitError
			if !errors.As(err, &exit) || exit.ExitCode() == 0 {
				t.Fatalf("exit: %v, want non-zero\n%s", err, out)
			}
			text := strings.TrimSpace(string(out))
			if strings.Count(text, "\n") != 0 || !strings.HasPrefix(text, "mesh-provisioner: ") || !strings.Contains(text, tt.says) {
				t.Errorf("output %q, want one line saying %q", text, tt.says)
			}
		})
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
)

// envOf returns a lookup of exactly these variables, as os.LookupEnv would
// see them.
func envOf(vars map[string]string) func(string) (string, bool) {
	return func(name string) (string, bool) {
		v, ok := vars[name]
		return v, ok
	}
}

// otherValue returns a value fs accepts for flag name that differs from its
// default: proof that whatever sets it was read.
func otherValue(t *testing.T, define func(*flag.FlagSet) action, name string) string {
	t.Helper()
	for _, candidate := range []string{"true", "false", "7", "7s", "error", "json"} {
		fs := flag.NewFlagSet("probe", flag.ContinueOnError)
		define(fs)
		if fs.Set(name, candidate) == nil && fs.Lookup(name).Value.String() != fs.Lookup(name).DefValue {
			return candidate
		}
	}
	t.Fatalf("no value to try for --%s", name)
	return ""
}

// TestEveryFlagHasItsCommandsVariable takes the flags from the commands'
// flag sets themselves: a flag added later is checked too.
func TestEveryFlagHasItsCommandsVariable(t *testing.T) {
	t.Parallel()
	owner := map[string]string{} // variable -> command.flag
	for _, name := range slices.Sorted(maps.Keys(commands)) {
		cmd := commands[name]
		var help strings.Builder
		if err := runWithEnv(context.Background(), []string{name, "--help"}, envOf(nil), io.Discard, &help); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("%s --help = %v", name, err)
		}
		fs := flag.NewFlagSet(name, flag.ContinueOnError)
		cmd.define(fs)
		fs.VisitAll(func(f *flag.Flag) {
			variable := envName(name, f.Name)
			t.Run(name+" --"+f.Name, func(t *testing.T) {
				if !strings.HasPrefix(variable, "MESH_PROVISIONER_"+strings.ToUpper(name)+"_") {
					t.Errorf("variable %s does not name its command", variable)
				}
				if prev, taken := owner[variable]; taken {
					t.Errorf("variable %s sets both %s and %s --%s", variable, prev, name, f.Name)
				}
				owner[variable] = name + " --" + f.Name
				if !strings.Contains(help.String(), "--"+f.Name+"  [$"+variable+"]") {
					t.Errorf("%s --help does not list --%s with $%s", name, f.Name, variable)
				}

				value := otherValue(t, cmd.define, f.Name)
				for _, tt := range []struct {
					variable string
					read     bool
				}{{variable, true}, {legacyEnvName(f.Name), false}} {
					fs := flag.NewFlagSet(name, flag.ContinueOnError)
					cmd.define(fs)
					warnings, err := parseFlags(fs, name, nil, envOf(map[string]string{tt.variable: value}), io.Discard, "")
					if err != nil {
						t.Fatalf("$%s=%s: %v", tt.variable, value, err)
					}
					if got := fs.Lookup(f.Name).Value.String() != f.DefValue; got != tt.read {
						t.Errorf("$%s=%s changes --%s: %v, want %v", tt.variable, value, f.Name, got, tt.read)
					}
					wantWarning := []string(nil)
					if !tt.read {
						wantWarning = []string{"$" + tt.variable + " is not read; set $" + variable + " instead"}
					}
					if diff := cmp.Diff(wantWarning, warnings); diff != "" {
						t.Errorf("warnings with $%s set (-want +got):\n%s", tt.variable, diff)
					}
				}
			})
		})
	}
}

// syncBuffer collects what many goroutines write, such as a command's log.
type syncBuffer struct{ testlog.Buffer }

// waitFor waits until the buffer holds want.
func (b *syncBuffer) waitFor(t *testing.T, want string, within time.Duration) {
	t.Helper()
	natstest.CheckFor(t, within, func() error {
		if got := b.String(); !strings.Contains(got, want) {
			return fmt.Errorf("no %q in:\n%s", want, got)
		}
		return nil
	})
}

// serving is serve run in this process: its log, and its end.
type serving struct {
	log  *syncBuffer
	stop context.CancelFunc
	done chan error
}

// serveInProcess runs serve with args and exactly the variables env, until
// the test ends or stop is called.
func serveInProcess(t *testing.T, args []string, env map[string]string) *serving {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &serving{log: &syncBuffer{}, stop: cancel, done: make(chan error, 1)}
	go func() { s.done <- runWithEnv(ctx, append([]string{"serve"}, args...), envOf(env), io.Discard, s.log) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-s.done: //nolint:errcheck // the tests that care read serve's error themselves
		case <-time.After(20 * time.Second):
			t.Error("serve still running 20s after it was stopped")
		}
	})
	return s
}

func TestVariablesOfOtherCommandsAreNotRead(t *testing.T) {
	t.Parallel()
	url := queryMesh(t)
	unreachable := "nats://127.0.0.1:1"

	t.Run("query registry", func(t *testing.T) {
		t.Parallel()
		// Under one unscoped scheme a node's MESH_PROVISIONER_NODE would
		// narrow the registry, which the service refuses.
		var out bytes.Buffer
		stderr := &syncBuffer{}
		err := runWithEnv(context.Background(), []string{"query", "registry", "--nats-url", url}, envOf(map[string]string{
			"MESH_PROVISIONER_NODE":            "ace",
			"MESH_PROVISIONER_MODULE":          "web",
			"MESH_PROVISIONER_STATUS_NATS_URL": unreachable,
			"MESH_PROVISIONER_SERVE_NATS_URL":  unreachable,
			"MESH_PROVISIONER_CAPTURE_TIMEOUT": "1ns",
		}), &out, stderr)
		if err != nil {
			t.Fatalf("query registry: %v", err)
		}
		want, err := os.ReadFile(filepath.Join("testdata", "query_registry.golden"))
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(string(want), out.String()); diff != "" {
			t.Errorf("query registry with other commands' variables set (-golden +got):\n%s", diff)
		}
		for _, warning := range []string{"$MESH_PROVISIONER_NODE is not read; set $MESH_PROVISIONER_QUERY_NODE instead", "$MESH_PROVISIONER_MODULE is not read"} {
			if strings.Count(stderr.String(), warning) != 1 {
				t.Errorf("stderr %q, want the warning %q once", stderr.String(), warning)
			}
		}
	})

	t.Run("serve embeds whatever query's URL", func(t *testing.T) {
		t.Parallel()
		s := serveInProcess(t, []string{"--listen", "127.0.0.1:0", "--state-dir", t.TempDir()}, map[string]string{
			"MESH_PROVISIONER_QUERY_NATS_URL": unreachable,
			"MESH_PROVISIONER_NATS_URL":       unreachable,
		})
		s.log.waitFor(t, "msg=serving", 20*time.Second)
		if !strings.Contains(s.log.String(), `msg="embedded nats-server started"`) {
			t.Errorf("serve did not embed a nats-server:\n%s", s.log)
		}
		if want := "$MESH_PROVISIONER_NATS_URL is not read; set $MESH_PROVISIONER_SERVE_NATS_URL instead"; !strings.Contains(s.log.String(), want) {
			t.Errorf("no warning %q in:\n%s", want, s.log)
		}
	})
}

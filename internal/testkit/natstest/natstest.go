// Package natstest starts real, embedded nats-servers with JetStream for
// tests: no fake bus, no fake KV.
package natstest

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// Start runs a nats-server with JetStream on a free loopback port, its store
// in a temporary directory, and stops it when the test ends.
func Start(t testing.TB) *server.Server {
	t.Helper()
	return start(t, &server.Options{}, true)
}

// StartWithConfig runs a nats-server from configuration text, as an operator
// would write it in a file (authorization blocks included). The store
// directory is set by the helper, and the listen address unless the text
// gives one.
func StartWithConfig(t testing.TB, config string) *server.Server {
	t.Helper()
	return start(t, processConfig(t, config), true)
}

// processConfig reads configuration text as nats-server reads its file.
func processConfig(t testing.TB, config string) *server.Options {
	t.Helper()
	file := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("nats-server configuration: %v\n%s", err, config)
	}
	return opts
}

// StartDenying runs a nats-server with JetStream (as StartWithConfig) and
// two users: "admin", who may publish and subscribe to anything, and user,
// who may too but for publishing to the subjects in deny. Each password is
// its user's name. A test denies its subject under test a request (a
// consumer's creation, say) to see how the service does without it.
func StartDenying(t testing.TB, user string, deny ...string) *server.Server {
	t.Helper()
	return StartWithConfig(t, denying(user, deny))
}

// ReloadDenying reloads a server StartDenying started with what user is
// denied replaced by deny (none: user may do anything), as an operator's
// configuration reload does: connected clients keep their connections.
func ReloadDenying(t testing.TB, s *server.Server, user string, deny ...string) {
	t.Helper()
	opts := processConfig(t, denying(user, deny))
	v, ok := started.Load(s)
	if !ok {
		t.Fatal("natstest: ReloadDenying of a server natstest did not start")
	}
	// What start set, the server's address and its configuration file's
	// name: a reload may not change them.
	was := v.(*server.Options)
	opts.ConfigFile, opts.Host, opts.Port, opts.JetStream, opts.StoreDir, opts.NoLog, opts.NoSigs = was.ConfigFile, was.Host, -1, was.JetStream, was.StoreDir, true, true
	if err := s.ReloadOptions(opts); err != nil {
		t.Fatalf("nats-server reload: %v", err)
	}
}

// denying is StartDenying's configuration.
func denying(user string, deny []string) string {
	quoted := make([]string, len(deny))
	for i, subject := range deny {
		quoted[i] = strconv.Quote(subject)
	}
	return fmt.Sprintf(`
authorization {
  users = [
    { user: admin, password: admin }
    { user: %[1]q, password: %[1]q, permissions: {
        publish: { allow: [">"], deny: [%[2]s] }
        subscribe: { allow: [">"] }
    } }
  ]
}`, user, strings.Join(quoted, ", "))
}

// started holds the options start gave each server, for ReloadDenying.
var started sync.Map // *server.Server to *server.Options

func start(t testing.TB, opts *server.Options, jetStream bool) *server.Server {
	t.Helper()
	if opts.Host == "" {
		opts.Host = "127.0.0.1"
	}
	if opts.Port == 0 {
		opts.Port = -1 // a free one
	}
	if opts.JetStream = jetStream; jetStream {
		opts.StoreDir = t.TempDir()
	}
	opts.NoLog = true
	opts.NoSigs = true
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server: %v", err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("nats-server did not become ready in 10s")
	}
	started.Store(s, opts.Clone())
	t.Cleanup(func() {
		started.Delete(s)
		s.Shutdown()
		s.WaitForShutdown()
	})
	return s
}

// Connect opens a connection to s that is closed when the test ends.
func Connect(t testing.TB, s *server.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(s.ClientURL(), append([]nats.Option{quietSlowConsumers}, opts...)...)
	if err != nil {
		t.Fatalf("connect to %s: %v", s.ClientURL(), err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// StartWithoutJetStream runs a nats-server with no JetStream, as a NATS a
// program might be pointed at by mistake.
func StartWithoutJetStream(t testing.TB) *server.Server {
	t.Helper()
	return start(t, &server.Options{}, false)
}

// quietSlowConsumers reports a connection's asynchronous errors on stderr
// as nats.go's default handler does, but not slow consumers: a flood makes
// them by the ten thousand, which buries a failing test's own lines, and
// the service's stats and the server count them. A test's own
// nats.ErrorHandler, given later, replaces it.
var quietSlowConsumers = nats.ErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
	if errors.Is(err, nats.ErrSlowConsumer) {
		return
	}
	if sub != nil {
		fmt.Fprintf(os.Stderr, "nats: %v on a connection to %s for a subscription on %q\n", err, nc.ConnectedUrlRedacted(), sub.Subject)
		return
	}
	fmt.Fprintf(os.Stderr, "nats: %v on a connection to %s\n", err, nc.ConnectedUrlRedacted())
})

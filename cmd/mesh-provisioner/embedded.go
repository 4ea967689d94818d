package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/novox/mesh-provisioner/wire"
)

// ErrListenAddressInUse: something already listens on --listen.
var ErrListenAddressInUse = errors.New("the listen address is in use")

// defaultStateDir is a mesh-provisioner folder in the user's state
// directory: $XDG_STATE_HOME, or ~/.local/state.
func defaultStateDir() string {
	if dir := os.Getenv("XDG_STATE_HOME"); dir != "" {
		return filepath.Join(dir, "mesh-provisioner")
	}
	if home, err := os.UserHomeDir(); err == nil {
		return filepath.Join(home, ".local", "state", "mesh-provisioner")
	}
	return "mesh-provisioner-state"
}

// embedded is a running nats-server and the lock of its state directory.
type embedded struct {
	*server.Server
	lock *stateLock
}

// stop shuts the server down, then gives the state directory up.
func (e *embedded) stop() {
	e.Shutdown()
	e.WaitForShutdown()
	e.lock.release()
}

// startEmbedded runs a nats-server with JetStream listening on listen
// (host:port; port 0 picks a free one), its store under stateDir, which it
// locks first: a second instance on the same directory fails at once. With
// 2 or more partitions, it maps the verbs' subjects to them
// (wire.PartitionMappings).
func startEmbedded(ctx context.Context, listen, stateDir string, partitions int, logger *slog.Logger) (*embedded, error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: want host:port, such as 127.0.0.1:4222", listen)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("--listen %q: the port must be a number from 0 to 65535", listen)
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir %q: %w", stateDir, err)
	}
	lock, err := lockStateDir(stateDir)
	if err != nil {
		return nil, err
	}
	e, err := startLocked(ctx, host, port, listen, stateDir, partitions, logger)
	if err != nil {
		lock.release()
		return nil, err
	}
	e.lock = lock
	return e, nil
}

func startLocked(ctx context.Context, host string, port int, listen, stateDir string, partitions int, logger *slog.Logger) (*embedded, error) {
	if port == 0 {
		port = server.RANDOM_PORT
	} else if err := probeListen(listen); err != nil {
		// nats-server would retry the bind for seconds, logging each try.
		return nil, err
	}
	s, err := server.NewServer(&server.Options{
		ServerName: "mesh-provisioner",
		Host:       host,
		Port:       port,
		JetStream:  true,
		StoreDir:   stateDir,
		NoSigs:     true, // this program handles signals and shuts the server down
	})
	if err != nil {
		return nil, fmt.Errorf("embedded nats-server: %w", err)
	}
	if partitions > 1 {
		for _, m := range wire.PartitionMappings(partitions) {
			if err := s.GlobalAccount().AddMapping(m.Source, m.Destination); err != nil {
				return nil, fmt.Errorf("embedded nats-server: mapping %s: %w", m.Source, err)
			}
		}
	}
	sl := &serverLogger{logger: logger.With("component", "nats-server")}
	s.SetLoggerV2(sl, logger.Enabled(ctx, slog.LevelDebug), false, false)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats-server did not start listening on %s within 10s", listen)
	}
	sl.started.Store(true)
	return &embedded{Server: s}, nil
}

// probeListen fails with ErrListenAddressInUse when listen cannot be bound.
func probeListen(listen string) error {
	l, err := net.Listen("tcp", listen)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("--listen %s: %w (another mesh-provisioner or nats-server?); stop it or give another --listen", listen, ErrListenAddressInUse)
		}
		return fmt.Errorf("--listen %s: %w", listen, err)
	}
	return l.Close()
}

// serverLogger hands nats-server's log lines to slog. Its notices while
// starting (the banner: version, store, limits) go at debug; after, at info.
// Warnings and errors keep their level.
type serverLogger struct {
	logger  *slog.Logger
	started atomic.Bool
}

func (l *serverLogger) Noticef(format string, v ...any) {
	level := slog.LevelInfo
	if !l.started.Load() {
		level = slog.LevelDebug
	}
	l.logger.Log(context.Background(), level, fmt.Sprintf(format, v...))
}
func (l *serverLogger) Warnf(format string, v ...any)  { l.logger.Warn(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Fatalf(format string, v ...any) { l.logger.Error(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Errorf(format string, v ...any) { l.logger.Error(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Debugf(format string, v ...any) { l.logger.Debug(fmt.Sprintf(format, v...)) }
func (l *serverLogger) Tracef(format string, v ...any) { l.logger.Debug(fmt.Sprintf(format, v...)) }

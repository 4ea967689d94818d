package main

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

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

// startEmbedded runs a nats-server with JetStream listening on listen
// (host:port; port 0 picks a free one), its store under stateDir.
func startEmbedded(listen, stateDir string, logger *slog.Logger) (*server.Server, error) {
	host, portText, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("--listen %q: want host:port, such as 127.0.0.1:4222", listen)
	}
	port, err := strconv.Atoi(portText)
	if err != nil || port < 0 || port > 65535 {
		return nil, fmt.Errorf("--listen %q: the port must be a number from 0 to 65535", listen)
	}
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return nil, fmt.Errorf("--state-dir %q: %w", stateDir, err)
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
	s.SetLoggerV2(serverLogger{logger.With("component", "nats-server")}, false, false, false)
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		return nil, fmt.Errorf("embedded nats-server did not start listening on %s within 10s (is the port taken?)", listen)
	}
	return s, nil
}

// serverLogger hands nats-server's log lines to slog.
type serverLogger struct{ *slog.Logger }

func (l serverLogger) Noticef(format string, v ...any) { l.Info(fmt.Sprintf(format, v...)) }
func (l serverLogger) Warnf(format string, v ...any)   { l.Warn(fmt.Sprintf(format, v...)) }
func (l serverLogger) Fatalf(format string, v ...any)  { l.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Errorf(format string, v ...any)  { l.Error(fmt.Sprintf(format, v...)) }
func (l serverLogger) Debugf(format string, v ...any)  { l.Debug(fmt.Sprintf(format, v...)) }
func (l serverLogger) Tracef(format string, v ...any)  { l.Debug(fmt.Sprintf(format, v...)) }

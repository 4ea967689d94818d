package main

import (
	"context"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/internal/ops"
	"github.com/novox/mesh-provisioner/internal/sdnotify"
	"github.com/novox/mesh-provisioner/service"
)

// What serve --http and systemd add to serve, each hooked in with a line.

// startHTTP starts the operator's HTTP server (/healthz, /readyz, /metrics,
// the status page) on addr; with no addr it returns nil, whose methods do
// nothing.
func startHTTP(ctx context.Context, addr string, logger *slog.Logger) (*ops.Server, error) {
	if addr == "" {
		return nil, nil
	}
	return ops.Start(ctx, ops.Config{Addr: addr, Logger: logger})
}

// attachHTTP hands the HTTP server the running service: it is ready while
// the service is and both connections are up, and asks the mesh on the
// service's connection.
func attachHTTP(srv *ops.Server, svc *service.Service, nc, watchNC *nats.Conn) {
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{nc, watchNC}, Ask: nc})
}

// notifySystemd tells systemd state (sdnotify.Ready, sdnotify.Stopping)
// when serve runs as a unit of Type=notify; elsewhere it does nothing.
func notifySystemd(logger *slog.Logger, state string) {
	sent, err := sdnotify.Notify(state)
	switch {
	case err != nil:
		logger.Warn("could not notify systemd", "state", state, "err", err)
	case sent:
		logger.Debug("notified systemd", "state", state)
	}
}

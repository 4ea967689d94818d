package main

import (
	"context"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/internal/observe/ops"
	"github.com/novox/mesh-provisioner/internal/observe/sdnotify"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// What serve --http and systemd add to serve, each hooked in with a line.

// startHTTP starts the operator's HTTP server (/healthz, /readyz, /metrics,
// the status page) on --http, guarded by --http-token-file's token and
// --http-hosts; with no --http it returns nil, whose methods do nothing.
func (f *serveFlags) startHTTP(ctx context.Context, logger *slog.Logger) (*ops.Server, error) {
	if f.http == "" {
		return nil, nil
	}
	cfg := ops.Config{Addr: f.http, Logger: logger, Hosts: splitList(f.httpHosts), Version: buildVersion()}
	if f.httpTokenFile != "" {
		token, err := ops.ReadTokenFile(f.httpTokenFile)
		if err != nil {
			return nil, fmt.Errorf("--http-token-file: %w", err)
		}
		cfg.Token = token
	}
	return ops.Start(ctx, cfg)
}

// attachHTTP hands the HTTP server the running service: it is ready while
// the service is and both connections are up; the page asks the mesh on ask,
// and /metrics reads the buckets' last revisions on the writer's connection.
// The page names ask's identity when NATS refuses it.
func attachHTTP(srv *ops.Server, svc *service.Service, nc, watchNC, ask *nats.Conn) {
	as := "the operator's identity of --http-creds, --http-nats-url and --http-inbox-prefix"
	if ask == nc {
		as = "the server's answering identity (serve has no --http-creds, --http-nats-url nor --http-inbox-prefix)"
	}
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{nc, watchNC}, Ask: ask, Read: watchNC, AskAs: as})
}

// connectPage opens the connection the status page reads the mesh on, as
// the operator's identity that --http-creds (and --http-nats-url) name, with
// its --http-inbox-prefix. Without them it returns nc: the answering
// identity, which under the generated permissions may not read (the page
// says so), but which an embedded or single-identity mesh allows.
func (f *serveFlags) connectPage(ctx context.Context, url string, nc *nats.Conn, logger *slog.Logger, opts []nats.Option) (*nats.Conn, func(), error) {
	if f.http == "" || (f.page.url == "" && f.page.creds == "" && f.page.inbox == "" && f.page.contextOptions == nil) {
		return nc, func() {}, nil
	}
	page := f.page
	if page.url == "" {
		page.url = url
	}
	conn, err := page.connect(ctx, page.url, wire.ServiceName+" page", logger, connectEvents{}, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("--http-nats-url: %w", err)
	}
	return conn, conn.Close, nil
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

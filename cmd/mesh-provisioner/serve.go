package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

const serveSynopsis = `Usage: mesh-provisioner [serve] [flags]

Serves the mesh's provisioning registry and the read-only verbs
mesh-provisioner.provisioning and mesh-provisioner.compose as one NATS micro
service, answered from a watched copy of the buckets. With no --nats-url it
embeds a nats-server with JetStream, listening on --listen, its store in
--state-dir; with --nats-url it connects to that NATS and embeds nothing.
It creates the four provisioning buckets if they are missing, writes the
registry at start and every --registry-interval, and stops cleanly on
SIGINT or SIGTERM.

Other commands (each with --help): query, permissions, capture, simulate, version`

type serveFlags struct {
	connect          connectFlags
	log              logFlags
	listen           string
	stateDir         string
	replicas         int
	registryInterval time.Duration
	readyTimeout     time.Duration
	slowCompose      time.Duration
	revisionWait     time.Duration
	maxQueueWait     time.Duration
}

func serve(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mesh-provisioner serve", flag.ContinueOnError)
	var f serveFlags
	f.connect.register(fs, "", "URL of an existing NATS to join; empty embeds a nats-server")
	f.log.register(fs)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:4222", "host:port the embedded nats-server listens on (port 0 picks a free one)")
	fs.StringVar(&f.stateDir, "state-dir", defaultStateDir(), "the program's own directory: the embedded nats-server's JetStream store")
	fs.IntVar(&f.replicas, "replicas", 1, "replicas of each bucket it creates: 1, or 3 on a NATS cluster")
	fs.DurationVar(&f.registryInterval, "registry-interval", registry.DefaultInterval, "how often the registry is reconciled into its bucket")
	fs.DurationVar(&f.readyTimeout, "ready-timeout", time.Minute, "how long to wait for the buckets' initial values before giving up")
	fs.DurationVar(&f.slowCompose, "slow-compose", service.DefaultSlowCompose, "a composition slower than this is logged with its phases")
	fs.DurationVar(&f.revisionWait, "revision-wait", service.DefaultRevisionWait, "how long a request that asks for a revision the copy has not reached waits before a 503")
	fs.DurationVar(&f.maxQueueWait, "max-queue-wait", service.DefaultMaxQueueWait, "a request that waited longer than this for a worker is answered 503 without being computed")
	if err := parseFlags(fs, args, stderr, serveSynopsis); err != nil {
		return err
	}
	if f.replicas < 1 || f.replicas > 5 {
		return fmt.Errorf("--replicas %d: use 1 to 5 (3 on a cluster)", f.replicas)
	}
	if f.registryInterval < time.Second {
		return fmt.Errorf("--registry-interval %s: use at least 1s", f.registryInterval)
	}
	if f.slowCompose <= 0 || f.revisionWait <= 0 || f.maxQueueWait <= 0 {
		return fmt.Errorf("--slow-compose, --revision-wait and --max-queue-wait must be positive durations")
	}
	logger, err := f.log.logger(stderr)
	if err != nil {
		return err
	}
	return f.run(ctx, logger)
}

func (f *serveFlags) run(ctx context.Context, logger *slog.Logger) error {
	url := f.connect.url
	var opts []nats.Option
	var embedded *server.Server
	if url == "" {
		var err error
		if embedded, err = startEmbedded(f.listen, f.stateDir, logger); err != nil {
			return err
		}
		defer func() {
			embedded.Shutdown()
			embedded.WaitForShutdown()
		}()
		url = embedded.ClientURL()
		opts = append(opts, nats.InProcessServer(embedded))
		logger.Info("embedded nats-server started", "url", url, "state_dir", f.stateDir)
	}
	closed := make(chan struct{})
	opts = append(opts,
		// Replies arrive on the server's own inbox, which its permissions
		// (mesh-provisioner permissions --server) grant.
		nats.CustomInboxPrefix(wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity)),
		nats.ClosedHandler(func(*nats.Conn) { close(closed) }))
	nc, err := f.connect.connect(url, wire.ServerIdentity, logger, opts...)
	if err != nil {
		return err
	}
	defer func() {
		// Drain: finish what is in flight, then close, before the embedded
		// server (if any) goes down.
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		<-closed
	}()

	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{Replicas: f.replicas}); err != nil {
		return err
	}
	registryKV, err := js.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		return fmt.Errorf("open registry bucket: %w", err)
	}
	reconciler := &registry.Reconciler{KV: registryKV, Interval: f.registryInterval, Logger: logger}

	svc, err := service.Start(ctx, service.Config{
		Conn:         nc,
		Version:      buildVersion(),
		Logger:       logger,
		SlowCompose:  f.slowCompose,
		RevisionWait: f.revisionWait,
		MaxQueueWait: f.maxQueueWait,
	})
	if err != nil {
		return err
	}
	defer svc.Stop()

	// The reconciler and the service run side by side; the first to fail
	// ends both, and shutdown waits for each.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := reconciler.Run(gctx); err != nil {
			return fmt.Errorf("reconcile registry: %w", err)
		}
		return nil
	})
	g.Go(func() error {
		readyCtx, cancel := context.WithTimeout(gctx, f.readyTimeout)
		defer cancel()
		if err := svc.WaitReady(readyCtx); err != nil {
			if gctx.Err() != nil {
				return nil
			}
			return err
		}
		info := svc.Info()
		logger.Info("serving", "service", info.Name, "version", info.Version, "id", info.ID,
			"subjects", []string{wire.ProvisioningSubject, wire.ComposeSubject}, "nats_url", redactURL(url))
		<-gctx.Done()
		return nil
	})
	if err := g.Wait(); err != nil {
		return err
	}
	logger.Info("shutting down: draining the service and the connection")
	return nil
}

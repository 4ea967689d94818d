package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"golang.org/x/sync/errgroup"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/observe/ops"
	"github.com/novox/mesh-provisioner/internal/observe/sdnotify"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/wire"
)

const serveSynopsis = `Usage: mesh-provisioner [serve] [flags]

Serves the mesh's provisioning registry as one NATS micro service: the read
verbs mesh-provisioner.provisioning, .compose and .provisions, answered from
a watched copy of the buckets, and the write verbs (put, delete, apply,
declare, bind) through which nodes and providers write their own records,
the service being the only writer. With no NATS named (--nats-url, --context,
$NATS_CONTEXT, $NATS_URL) it embeds a nats-server with JetStream, listening
on --listen, its store in --state-dir, which one instance at a time may own
(a second exits at once, naming the PID that holds it); with one it connects
to that NATS as the answering identity (and --writer-context's or
--writer-nats-url's writing identity) and embeds nothing, and while it cannot
be reached at start keeps trying, a log line per attempt (--connect-retry=false
exits instead). It creates the six buckets if they are missing. Any number of
instances may serve one mesh; the one that holds the provisioner seat writes
the registry (at the start of its tenure, every --registry-interval and
whenever an entry is changed by anyone else) and each node's plan digest.
With --partitions and --hold, an instance serves some partitions only, holds
their nodes alone and hands other requests to their holders; each
partition's seat says who writes its plans. With --hold auto, the
instances deal the partitions among themselves, and move them as instances
come and go. It
stops cleanly on SIGINT or SIGTERM, handing the seat to a standby. nats.go's
and nats-server's messages go through its log, passwords redacted.

Other commands (each with --help): init, check, query, status, permissions,
capture, simulate, put, delete, version`

type serveFlags struct {
	connect          connectFlags
	writer           connectFlags // the writing identity's; empty fields fall back to connect's
	page             connectFlags // the status page's operator identity; all empty: the answering connection
	replyPrefixes    string
	log              logFlags
	listen           string
	stateDir         string
	replicas         int
	registryInterval time.Duration
	plansInterval    time.Duration
	restoreDelay     time.Duration
	readyTimeout     time.Duration
	slowCompose      time.Duration
	revisionWait     time.Duration
	maxValueSize     int
	bucketMaxBytes   int64
	planWatchers     int
	nodeMaxKeys      int
	nodeMaxBytes     int
	pageMaxBytes     int
	providerMaxKeys  int
	connectRetry     bool
	maxQueueWait     time.Duration
	maxPerAsker      int
	partitions       int
	hold             string
	held             []int // --hold, read
	share            bool  // --hold auto
	holdCopies       int
	holdExpect       int
	maxRatePerAsker  int
	maxWriteRate     int
	http             string
	httpTokenFile    string
	httpHosts        string
}

func defineServe(fs *flag.FlagSet) action {
	var f serveFlags
	f.connect.register(fs, "URL of an existing NATS to join (a comma-separated list: any of them), as the answering identity `permissions --server` prints; empty: the context's, then $NATS_URL, and with none embeds a nats-server")
	fs.StringVar(&f.writer.url, "writer-nats-url", "", "URL the writing connection (watchers, seat, registry writes) joins, as the identity `permissions --server-writer` prints; empty: --writer-context's, then --nats-url")
	fs.StringVar(&f.writer.creds, "writer-creds", "", "credentials file of the writing identity; empty: --writer-context's, then the answering identity's (one identity for both connections)")
	fs.StringVar(&f.writer.nkey, "writer-nkey", "", "file holding the writing identity's nkey seed; empty: as --writer-creds")
	fs.StringVar(&f.writer.context, "writer-context", "", "natscli context of the writing identity, a name or a file's path (mesh-provisioner init writes server-writer.json); its URL and credentials count where --writer-nats-url and --writer-creds are empty")
	fs.StringVar(&f.replyPrefixes, "reply-prefixes", strings.Join(wire.ReplyPrefixes(), ","), "comma-separated subject prefixes the service answers to; a request whose reply subject is under none of them is not answered (each ends with '.', none starts with '$')")
	f.log.register(fs, slog.LevelInfo)
	fs.StringVar(&f.listen, "listen", "127.0.0.1:4222", "host:port the embedded nats-server listens on (port 0 picks a free one)")
	fs.StringVar(&f.stateDir, "state-dir", defaultStateDir(), "the program's own directory: the embedded nats-server's JetStream store, locked by one instance at a time (mesh-provisioner.lock holds its PID)")
	fs.IntVar(&f.replicas, "replicas", 1, "replicas of each bucket it creates: 1, or 3 on a NATS cluster")
	fs.DurationVar(&f.registryInterval, "registry-interval", registry.DefaultInterval, "how often the registry is reconciled into its bucket")
	fs.DurationVar(&f.plansInterval, "plans-interval", service.DefaultPlansInterval, "how often the seat's holder looks for plans to write to mesh-provisioner_plans that no change announced (gone, a provider's bucket); a change to the copy is looked at 2ms after it (or as the pass running ends), and changes within that are composed once")
	fs.DurationVar(&f.restoreDelay, "registry-restore-delay", registry.DefaultRestoreDelay, "how long a registry entry changed by anyone else stands before the seat's holder restores it (a burst is restored once)")
	fs.DurationVar(&f.readyTimeout, "ready-timeout", time.Minute, "how long to wait for the buckets' initial values before giving up")
	fs.DurationVar(&f.slowCompose, "slow-compose", service.DefaultSlowCompose, "a composition slower than this is logged with its phases")
	fs.DurationVar(&f.revisionWait, "revision-wait", service.DefaultRevisionWait, "how long a request that asks for a revision the copy has not reached waits before a 503")
	fs.IntVar(&f.maxValueSize, "max-value-size", buckets.DefaultMaxValueSize, "largest value a state bucket takes, in bytes; nats-server refuses a larger put from any node (a need, applied record or collection item is a few hundred bytes)")
	fs.Int64Var(&f.bucketMaxBytes, "bucket-max-bytes", buckets.DefaultMaxBytes, "most bytes each state bucket holds; a put that would grow it further is refused")
	fs.IntVar(&f.planWatchers, "plans-max-watchers", buckets.DefaultMaxPlanWatchers, "most consumers of mesh-provisioner_plans: the seat holder's watch of it and operators' reads (nodes make none: they hear their key's writes on its subject)")
	fs.IntVar(&f.nodeMaxKeys, "node-max-keys", service.DefaultNodeMaxKeys, "most keys the server holds of one node in one state bucket; further keys are reported as malformed, not held (-1: no limit)")
	fs.IntVar(&f.nodeMaxBytes, "node-max-bytes", service.DefaultNodeMaxBytes, "most value bytes the server holds of one node in one state bucket (-1: no limit)")
	fs.IntVar(&f.pageMaxBytes, "page-max-bytes", service.DefaultPageMaxBytes, "most bytes the server fills one page of an answer with (a client follows next_page_token for the rest); never more than the NATS server's max_payload, and a single item larger than this is still sent alone")
	fs.IntVar(&f.providerMaxKeys, "provider-max-keys", service.DefaultProviderMaxKeys, "most keys the server holds of one provider's bucket; one holding more is not followed, its provisions pending, until it holds fewer (-1: no limit)")
	fs.DurationVar(&f.maxQueueWait, "max-queue-wait", service.DefaultMaxQueueWait, "a request that waited longer than this for a worker is answered 503 without being computed")
	fs.IntVar(&f.maxRatePerAsker, "max-rate-per-asker", service.DefaultMaxRatePerAsker, "most requests a second of one node or provider on each of its own subjects, as many at once; more are dropped where they arrive, counted by asker in the stats and metrics, one a second answered with a 503 that says why (-1: no limit)")
	fs.IntVar(&f.partitions, "partitions", 0, "split the nodes and providers into this many partitions (2 to 1024), as nats-server's subject mapping does (init --partitions, permissions --partitions write it; the embedded server has it): each partition's verbs are answered on subjects of its own, and one whose asker floods is unsubscribed for a while, so that nats-server drops its requests unsent and every other partition is answered as before; 0: unpartitioned")
	fs.StringVar(&f.hold, "hold", "", "with --partitions, the partitions this instance serves, as a list of numbers and ranges (0-3,8): it holds their nodes' records alone, answers their nodes and providers, hands any other request about nodes to an instance that serves their partition, and writes the plans of those whose seats it takes (a seat a partition; other instances given the same partitions stand by for them); each partition must be served by some instance; auto: the instances given auto deal the partitions among themselves and move them as instances come and go, each partition read by its next holder before its last lets it go; empty: every partition, the whole mesh held")
	fs.IntVar(&f.holdCopies, "hold-copies", 1, "with --hold auto, how many instances serve each partition: 2 keeps a partition answered while one of its instances dies (its seat then taken once its lease runs out), at twice each instance's memory")
	fs.IntVar(&f.holdExpect, "hold-expect", 0, "with --hold auto, how many instances are deployed to share the partitions (a deploy's replicas): one that starts deals itself its first share once it has heard that many, itself among them, rather than after 1.5s of discovery; fewer heard within the 1.5s are dealt among, and the others join as they come; 0: always the 1.5s")
	fs.IntVar(&f.maxWriteRate, "max-write-rate-per-asker", service.DefaultMaxWriteRatePerAsker, "--max-rate-per-asker for the write verbs (put, delete, apply, declare, bind), each of which JetStream stores (-1: no limit)")
	fs.IntVar(&f.maxPerAsker, "max-per-asker", service.DefaultMaxPerAsker, "most requests of one node or provider, on its own subjects, that wait for revisions, queue or are being answered at once; more get a 503, so that one cannot take the others' places (-1: no limit)")
	fs.StringVar(&f.page.url, "http-nats-url", "", "with --http, URL the status page reads the mesh on, as an operator's identity (permissions --operator); empty: --nats-url")
	fs.StringVar(&f.page.creds, "http-creds", "", "with --http, credentials of the operator's identity the status page reads the mesh as; with none of the --http-* identity flags the page reads on the answering connection, which the generated server permissions do not let read")
	fs.StringVar(&f.page.inbox, "http-inbox-prefix", "", "with --http, the inbox prefix of the page's operator identity (_INBOX_MESH.operator.<name>)")
	fs.StringVar(&f.page.context, "http-context", "", "with --http, the natscli context of the page's operator identity, a name or a file's path (init writes contexts/operator-<name>.json); its URL, credentials and inbox prefix count where the other --http-* flags are empty")
	fs.StringVar(&f.http, "http", "", "host:port of an HTTP server for operators: /healthz and /readyz for anyone; /metrics (Prometheus), a status page at / and each node's composition at /nodes/<node>/compose with --http-token-file's token; an empty host (:9090) listens on 127.0.0.1 only, every interface is 0.0.0.0:9090 or [::]:9090; empty serves none")
	fs.StringVar(&f.httpTokenFile, "http-token-file", "", "with --http, file holding the bearer token that /, /nodes/... and /metrics ask for as \"Authorization: Bearer <token>\": one line of 16 characters or more, in a file not every user may read; read once at start; empty: those paths answer 403 to everyone")
	fs.StringVar(&f.httpHosts, "http-hosts", "", "with --http, comma-separated host names and addresses the HTTP server answers to, as a request's Host header names them (without its port); others get 421 on every path but /healthz and /readyz; empty: localhost, 127.0.0.1, ::1 and --http's host unless it is empty, 0.0.0.0 or ::")
	fs.BoolVar(&f.connectRetry, "connect-retry", true, "with --nats-url, keep trying (a line per attempt) while NATS cannot be reached at start; false exits at once")
	return func(ctx context.Context, inv invocation) error {
		if f.replicas < 1 || f.replicas > 5 {
			return fmt.Errorf("--replicas %d: use 1 to 5 (3 on a cluster)", f.replicas)
		}
		if f.registryInterval < time.Second {
			return fmt.Errorf("--registry-interval %s: use at least 1s", f.registryInterval)
		}
		if f.restoreDelay <= 0 || f.restoreDelay > 4*time.Second {
			return fmt.Errorf("--registry-restore-delay %s: use a positive duration of at most 4s, so that a changed entry is restored within 5s", f.restoreDelay)
		}
		if f.maxValueSize < 1 || f.maxValueSize > 64<<20 || f.bucketMaxBytes < int64(f.maxValueSize) {
			return fmt.Errorf("--max-value-size %d and --bucket-max-bytes %d: the value size is 1 byte to 64 MiB, and a bucket holds at least one value", f.maxValueSize, f.bucketMaxBytes)
		}
		if f.nodeMaxKeys == 0 || f.nodeMaxBytes == 0 || f.providerMaxKeys == 0 || f.maxPerAsker == 0 || f.maxRatePerAsker == 0 || f.maxWriteRate == 0 {
			return fmt.Errorf("--node-max-keys, --node-max-bytes, --provider-max-keys, --max-per-asker, --max-rate-per-asker and --max-write-rate-per-asker must be positive, or -1 for no limit")
		}
		if f.pageMaxBytes < 4<<10 {
			return fmt.Errorf("--page-max-bytes %d: use at least 4096, so that a page carries more than its token and revisions", f.pageMaxBytes)
		}
		if err := permissions.CheckPartitions(f.partitions); err != nil {
			return fmt.Errorf("--%w", err)
		}
		var err error
		if f.held, f.share, err = parseHold(f.hold, f.partitions); err != nil {
			return err
		}
		if f.holdCopies < 1 || (f.holdCopies > 1 && !f.share) {
			return fmt.Errorf("--hold-copies %d: give 1 or more, and more than 1 only with --hold auto", f.holdCopies)
		}
		if f.holdExpect < 0 || (f.holdExpect > 0 && !f.share) {
			return fmt.Errorf("--hold-expect %d: give 0 or more, and more than 0 only with --hold auto", f.holdExpect)
		}
		if err := admission.CheckReplyPrefixes(splitList(f.replyPrefixes)); err != nil {
			return fmt.Errorf("--reply-prefixes %q: %w", f.replyPrefixes, err)
		}
		if f.slowCompose <= 0 || f.revisionWait <= 0 || f.maxQueueWait <= 0 {
			return fmt.Errorf("--slow-compose, --revision-wait and --max-queue-wait must be positive durations")
		}
		logger, err := f.log.logger(inv.stderr)
		if err != nil {
			return err
		}
		warnAll(logger, inv.warnings)
		if err := f.connect.resolve(inv.lookupEnv, ""); err != nil {
			return err
		}
		if f.writer.context != "" {
			if err := f.writer.applyContext(); err != nil {
				return fmt.Errorf("writer: %w", err)
			}
		}
		if f.page.context != "" {
			if err := f.page.applyContext(); err != nil {
				return fmt.Errorf("status page: %w", err)
			}
		}
		return f.run(ctx, logger)
	}
}

// writerConnect returns how the writing connection connects: --writer-nats-url
// and its credentials (--writer-creds, --writer-nkey or --writer-context's),
// each empty one as the answering connection's (url, the embedded server's
// when nothing is joined).
func (f *serveFlags) writerConnect(url string) (connectFlags, string) {
	writer := f.writer
	if writer.url == "" {
		writer.url = url
	}
	if writer.creds == "" && writer.nkey == "" && writer.contextOptions == nil {
		writer.creds, writer.nkey, writer.contextOptions = f.connect.creds, f.connect.nkey, f.connect.contextOptions
	}
	return writer, writer.url
}

// dial opens one of serve's connections, as c's identity, and waits until it
// is connected; drain finishes what is in flight, then closes it.
func dial(ctx context.Context, c connectFlags, url, name string, logger *slog.Logger, retry bool, onRefused func(), opts []nats.Option) (nc *nats.Conn, drain func(), err error) {
	closed := make(chan struct{})
	nc, err = c.connect(ctx, url, name, logger, connectEvents{onClosed: func() { close(closed) }, onRefused: onRefused, retry: retry}, opts...)
	if err != nil {
		return nil, nil, err
	}
	drain = func() {
		if err := nc.Drain(); err != nil {
			nc.Close()
		}
		<-closed
	}
	if err := waitConnected(ctx, nc); err != nil {
		drain()
		return nil, nil, fmt.Errorf("no NATS reached at %s: %w", redactURL(url), err)
	}
	return nc, drain, nil
}

// serveConns are serve's connections to NATS. The answering identity holds
// three: requests reads the verbs' requests only, answers sends answers and
// refusals, large the answers over service.LargeAnswer bytes, so that a
// flood's answers never slow the reading of requests and a client that does
// not read its large answers delays no other's small one. The writing
// identity's carries the watchers, the seat and the registry's writes, so
// that a flood of requests delays none of them, and the identity that
// answers requests cannot write.
type serveConns struct {
	requests, answers, large, writer *nats.Conn
	drains                           []func() // in the order opened
}

// dialAll opens serve's connections to url (the writer's to
// --writer-nats-url, if given).
func (f *serveFlags) dialAll(ctx context.Context, url string, logger *slog.Logger, httpServer *ops.Server, opts []nats.Option) (*serveConns, error) {
	c := &serveConns{}
	retry := f.connect.url != "" && f.connectRetry
	writer, writerURL := f.writerConnect(url)
	for _, d := range []struct {
		conn  **nats.Conn
		flags connectFlags
		url   string
		name  string
		opts  []nats.Option
	}{
		{&c.requests, f.connect, url, wire.ServerIdentity, opts},
		{&c.answers, f.connect, url, wire.ServerIdentity, opts},
		{&c.large, f.connect, url, wire.ServerIdentity, opts},
		{&c.writer, writer, writerURL, wire.WriterIdentity,
			append(slices.Clone(opts), nats.CustomInboxPrefix(wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity)))},
	} {
		identity := d.name
		conn, drain, err := dial(ctx, d.flags, d.url, d.name, logger, retry, func() { httpServer.CountRefusal(identity) }, d.opts)
		if err != nil {
			c.drain()
			return nil, err
		}
		*d.conn = conn
		c.drains = append(c.drains, drain)
	}
	return c, nil
}

// drain drains the connections, the last opened first: the writer's once
// the service has stopped its watchers, the requests' last.
func (c *serveConns) drain() {
	for _, drain := range slices.Backward(c.drains) {
		drain()
	}
}

// connected reports whether every connection is connected.
func (c *serveConns) connected() bool {
	return c.requests.IsConnected() && c.answers.IsConnected() && c.large.IsConnected() && c.writer.IsConnected()
}

// close closes every connection at once, draining nothing.
func (c *serveConns) close() {
	for _, nc := range []*nats.Conn{c.requests, c.answers, c.large, c.writer} {
		nc.Close()
	}
}

// joinNATS returns the NATS serve joins: --nats-url, or a nats-server it
// embeds (stopped by stop) and the option that reaches it in-process.
func (f *serveFlags) joinNATS(ctx context.Context, logger *slog.Logger) (url string, opts []nats.Option, stop func(), err error) {
	if f.connect.url != "" {
		return f.connect.url, nil, func() {}, nil
	}
	embedded, err := startEmbedded(ctx, f.listen, f.stateDir, f.partitions, logger)
	if err != nil {
		return "", nil, nil, err
	}
	url = embedded.ClientURL()
	logger.Info("embedded nats-server started", "url", url, "state_dir", f.stateDir)
	return url, []nats.Option{nats.InProcessServer(embedded)}, embedded.stop, nil
}

func (f *serveFlags) run(ctx context.Context, logger *slog.Logger) error {
	httpServer, err := f.startHTTP(ctx, logger)
	if err != nil {
		return err
	}
	defer httpServer.Close(ctx)
	url, opts, stopEmbedded, err := f.joinNATS(ctx, logger)
	if err != nil {
		return err
	}
	defer stopEmbedded() // after the connections drained
	conns, err := f.dialAll(ctx, url, logger, httpServer, opts)
	if err != nil {
		return err
	}
	defer conns.drain() // after the instance stopped
	inst, err := instance.Start(ctx, f.instanceConfig(conns, httpServer, logger))
	if err != nil {
		return err
	}
	ask, closePage, err := f.connectPage(ctx, url, conns.requests, logger, opts)
	if err != nil {
		inst.Stop()
		return err
	}
	defer closePage()
	attachHTTP(httpServer, inst.Service(), conns.requests, conns.writer, ask)
	if err := f.serve(ctx, logger, url, conns, inst); err != nil {
		return err
	}
	logger.Info("shutting down: draining the service and the connection")
	return nil
}

// instanceConfig is the instance serve's flags describe, on conns.
func (f *serveFlags) instanceConfig(conns *serveConns, httpServer *ops.Server, logger *slog.Logger) instance.Config {
	return instance.Config{
		Service: service.Config{
			Conn:                 conns.requests,
			AnswerConn:           conns.answers,
			LargeConn:            conns.large,
			WatchConn:            conns.writer,
			Version:              buildVersion(),
			Logger:               logger,
			SlowCompose:          f.slowCompose,
			RevisionWait:         f.revisionWait,
			NodeMaxKeys:          f.nodeMaxKeys,
			NodeMaxBytes:         f.nodeMaxBytes,
			PageMaxBytes:         f.pageMaxBytes,
			ProviderMaxKeys:      f.providerMaxKeys,
			MaxQueueWait:         f.maxQueueWait,
			MaxPerAsker:          f.maxPerAsker,
			MaxRatePerAsker:      f.maxRatePerAsker,
			Partitions:           f.partitions,
			Hold:                 f.held,
			MaxWriteRatePerAsker: f.maxWriteRate,
			ReplyPrefixes:        splitList(f.replyPrefixes),
			Observe:              httpServer.Observer(),
		},
		Buckets:          buckets.Config{Replicas: f.replicas, MaxValueSize: int32(f.maxValueSize), MaxBytes: f.bucketMaxBytes, MaxPlanWatchers: f.planWatchers},
		RegistryInterval: f.registryInterval,
		RestoreDelay:     f.restoreDelay,
		PlansInterval:    f.plansInterval,
		ReadyTimeout:     f.readyTimeout,
		SharePartitions:  f.share,
		ShareCopies:      f.holdCopies,
		ShareExpect:      f.holdExpect,
	}
}

// serve runs the instance until ctx ends or it fails, and returns once it
// has stopped, the seat handed back before the connections drain. It says
// "serving" once the instance does, and tells systemd.
func (f *serveFlags) serve(ctx context.Context, logger *slog.Logger, url string, conns *serveConns, inst *instance.Instance) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		<-gctx.Done()
		if !conns.connected() {
			// NATS is gone: stopping need not wait for answers from it
			// (consumers deleted, the seat handed back, the drain), which
			// would each time out; closed connections fail them at once.
			logger.Info("NATS is unreachable: closing the connections rather than draining them")
			conns.close()
		}
		return nil
	})
	g.Go(func() error { return inst.Run(gctx) })
	g.Go(func() error {
		select {
		case <-inst.Serving():
		case <-gctx.Done():
			return nil
		}
		info := inst.Service().Info()
		subjects := make([]string, 0, len(info.Endpoints))
		for _, e := range info.Endpoints {
			subjects = append(subjects, e.Subject)
		}
		natsFrom := f.connect.urlFrom
		if natsFrom == "" {
			natsFrom = "embedded"
		}
		logger.Info("serving", "service", info.Name, "version", info.Version, "id", info.ID, "seat_id", inst.Seat().ID(),
			"subjects", subjects, "nats_url", redactURL(url), "nats_url_from", natsFrom)
		notifySystemd(logger, sdnotify.Ready)
		<-gctx.Done()
		notifySystemd(logger, sdnotify.Stopping)
		return nil
	})
	return g.Wait()
}

// parseHold reads --hold: partitions and ranges of them (0-3,8), each of the
// --partitions the mesh has, each once, in order; or "auto", which shares
// them (share).
func parseHold(text string, partitions int) (hold []int, share bool, err error) {
	if strings.TrimSpace(text) == "" {
		return nil, false, nil
	}
	if partitions < 2 {
		return nil, false, fmt.Errorf("--hold %q: give --partitions too, the mappings' count; --hold lists some of them, or shares them (auto)", text)
	}
	if strings.TrimSpace(text) == "auto" {
		return nil, true, nil
	}
	for _, part := range strings.Split(text, ",") {
		first, last, isRange := strings.Cut(strings.TrimSpace(part), "-")
		from, err := strconv.Atoi(first)
		to := from
		if err == nil && isRange {
			to, err = strconv.Atoi(last)
		}
		if err != nil || from > to {
			return nil, false, fmt.Errorf("--hold %q: %q is neither a partition nor a range of them (2-5)", text, part)
		}
		if from < 0 || to >= partitions {
			return nil, false, fmt.Errorf("--hold %q: %q names a partition outside 0 to %d (--partitions %d)", text, part, partitions-1, partitions)
		}
		for p := from; p <= to; p++ {
			hold = append(hold, p)
		}
	}
	slices.Sort(hold)
	for i := 1; i < len(hold); i++ {
		if hold[i] == hold[i-1] {
			return nil, false, fmt.Errorf("--hold %q: partition %d is listed twice", text, hold[i])
		}
	}
	return hold, false, nil
}

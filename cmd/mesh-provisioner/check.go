package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/seat"
	"github.com/novox/mesh-provisioner/wire"
)

const checkSynopsis = `Usage: mesh-provisioner check --context C [--writer-context W]

Connects as the service's two identities, as serve would with the same
flags, and says, a line each, what works and what is missing: the answering
identity's grant, JetStream, the writer's grant, each bucket and the seat,
with the next step for each failure. It exits non-zero when anything the
service needs is missing. It writes nothing.`

// ErrCheckFailed is check's error when something the service needs is
// missing; the lines above it say what.
var ErrCheckFailed = errors.New("the service cannot run with these identities yet; see the FAIL lines")

func defineCheck(fs *flag.FlagSet) action {
	var (
		answering, writer connectFlags
		logs              logFlags
		timeout           time.Duration
	)
	answering.register(fs, "URL of the mesh's NATS, as serve's --nats-url; empty: the context's, then $NATS_URL, then "+defaultClientURL)
	fs.StringVar(&writer.url, "writer-nats-url", "", "as serve's: the writing identity's URL; empty: --writer-context's, then --nats-url")
	fs.StringVar(&writer.creds, "writer-creds", "", "as serve's: the writing identity's credentials file")
	fs.StringVar(&writer.nkey, "writer-nkey", "", "as serve's: the writing identity's nkey seed file")
	fs.StringVar(&writer.context, "writer-context", "", "as serve's: the writing identity's natscli context (init writes server-writer.json); empty: the answering identity's, which the generated permissions do not let write")
	logs.register(fs, slog.LevelWarn)
	fs.DurationVar(&timeout, "timeout", 5*time.Second, "how long each look may take")
	return func(ctx context.Context, inv invocation) error {
		logger, err := logs.logger(inv.stderr)
		if err != nil {
			return err
		}
		warnAll(logger, inv.warnings)
		if err := answering.resolve(inv.lookupEnv, defaultClientURL); err != nil {
			return err
		}
		if writer.context != "" {
			if err := writer.applyContext(); err != nil {
				return fmt.Errorf("writer: %w", err)
			}
		}
		f := serveFlags{connect: answering, writer: writer}
		writer, _ = f.writerConnect(answering.url)
		c := &checker{out: inv.stdout, timeout: timeout, logger: logger, writerNamed: writer.context != "" || f.writer.creds != "" || f.writer.nkey != ""}
		c.run(ctx, answering, writer)
		if c.failed {
			return ErrCheckFailed
		}
		return nil
	}
}

// checker prints check's lines and remembers whether one failed.
type checker struct {
	out         io.Writer
	timeout     time.Duration
	logger      *slog.Logger
	writerNamed bool // the writing identity was given, not taken from the answering one
	failed      bool
}

func (c *checker) ok(format string, args ...any) {
	fmt.Fprintf(c.out, "ok    "+format+"\n", args...)
}

func (c *checker) info(format string, args ...any) {
	fmt.Fprintf(c.out, "note  "+format+"\n", args...)
}

func (c *checker) fail(format string, args ...any) {
	c.failed = true
	fmt.Fprintf(c.out, "FAIL  "+format+"\n", args...)
}

// refusals collects the permission violations NATS reports on a connection.
type refusals struct {
	mu   sync.Mutex
	seen []string
}

func (r *refusals) record(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen = append(r.seen, err.Error())
}

// since returns the violations recorded after the first n.
func (r *refusals) since(n int) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.seen[n:]...)
}

func (r *refusals) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.seen)
}

// connect opens a connection for check, its refusals recorded; closeConn
// closes it and waits for nats.go's last event, so that no log line
// follows the command's end.
func (c *checker) connect(ctx context.Context, flags connectFlags, name string) (nc *nats.Conn, r *refusals, closeConn func(), err error) {
	r = &refusals{}
	closed := make(chan struct{})
	nc, err = flags.connect(ctx, flags.url, name, c.logger, connectEvents{onViolation: r.record, onClosed: func() { close(closed) }})
	if err != nil {
		return nil, nil, nil, err
	}
	return nc, r, func() {
		nc.Close()
		select {
		case <-closed:
		case <-time.After(time.Second):
		}
	}, nil
}

// settle waits for what NATS says of the requests sent so far: a
// violation comes asynchronously, before the answer to a flush.
func settle(nc *nats.Conn, r *refusals, before int, timeout time.Duration) []string {
	_ = nc.FlushTimeout(timeout)
	deadline := time.Now().Add(200 * time.Millisecond)
	for r.count() == before && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond) // the async handler's delivery: pacing
	}
	return r.since(before)
}

func (c *checker) run(ctx context.Context, answering, writer connectFlags) {
	nc, r, closeConn, err := c.connect(ctx, answering, "mesh-provisioner check")
	if err != nil {
		c.fail("the answering identity cannot connect: %v; check --nats-url, --context and its credentials", err)
		return
	}
	defer closeConn()
	c.ok("the answering identity connected to %s", nc.ConnectedUrlRedacted())
	c.checkAnswering(nc, r)

	wnc, wr, closeWriter, err := c.connect(ctx, writer, "mesh-provisioner check writer")
	if err != nil {
		c.fail("the writing identity cannot connect: %v; check --writer-nats-url, --writer-context and its credentials", err)
		return
	}
	defer closeWriter()
	c.ok("the writing identity connected to %s", wnc.ConnectedUrlRedacted())
	c.checkWriter(ctx, wnc, wr)
}

// checkAnswering subscribes, without a queue group (so no request is taken
// from a serving instance) and for a moment, where the service answers.
func (c *checker) checkAnswering(nc *nats.Conn, r *refusals) {
	before := r.count()
	subjects := []string{wire.ServiceName + ".>", "$SRV.PING." + wire.ServiceName}
	for _, subject := range subjects {
		sub, err := nc.SubscribeSync(subject)
		if err != nil {
			c.fail("the answering identity cannot subscribe to %s: %v", subject, err)
			return
		}
		defer func() { _ = sub.Unsubscribe() }()
	}
	if refused := settle(nc, r, before, c.timeout); len(refused) > 0 {
		c.fail("nats-server refused the answering identity where the service answers (%s); give it the permissions `mesh-provisioner permissions --server` prints", strings.Join(refused, "; "))
		return
	}
	c.ok("the answering identity may subscribe to the verbs and to micro's discovery (%s)", strings.Join(subjects, ", "))
}

func (c *checker) checkWriter(ctx context.Context, nc *nats.Conn, r *refusals) {
	js, err := jetstream.New(nc)
	if err != nil {
		c.fail("JetStream: %v", err)
		return
	}
	look, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	before := r.count()
	info, err := js.AccountInfo(look)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled), errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		c.fail("JetStream is not enabled for the writing identity's account; enable it in nats-server's configuration (jetstream {...})")
		return
	case err != nil:
		next := "give --writer-context the context of the identity `mesh-provisioner permissions --server-writer` prints (init writes contexts/server-writer.json)"
		if refused := settle(nc, r, before, c.timeout); len(refused) > 0 {
			who := "the writing identity"
			if !c.writerNamed {
				who = "the answering identity (serve writes as it when no writing identity is given)"
			}
			c.fail("the writer's grant: nats-server refused JetStream's API to %s: %s; %s", who, strings.Join(refused, "; "), next)
			return
		}
		c.fail("JetStream did not answer the writing identity: %v; %s", err, next)
		return
	}
	c.ok("JetStream: the writing identity's account may store %s", limitOf(info.Limits.MaxStore))
	for _, bucket := range append(keys.Buckets(), keys.PlansBucket) {
		before := r.count()
		kv, err := js.KeyValue(look, bucket)
		switch {
		case errors.Is(err, jetstream.ErrBucketNotFound):
			c.info("bucket %s: not created yet; serve creates it at start", bucket)
		case err != nil:
			refused := settle(nc, r, before, c.timeout)
			c.fail("bucket %s: the writing identity cannot read it (%v%s); give it the permissions `mesh-provisioner permissions --server-writer` prints", bucket, err, joinedRefusals(refused))
		default:
			status, err := kv.Status(look)
			if err != nil {
				c.fail("bucket %s: %v", bucket, err)
				continue
			}
			c.ok("bucket %s: %d values", bucket, status.Values())
		}
	}
	stream, err := js.Stream(look, wire.StreamOf(keys.RegistryBucket))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		c.info("the seat: no registry bucket yet; the first instance of serve takes the seat")
		return
	}
	if err != nil {
		c.fail("the seat: %v", err)
		return
	}
	holder, since, err := seat.Current(look, stream)
	switch {
	case err != nil:
		c.fail("the seat: the writing identity cannot read it (%v); give it the permissions `mesh-provisioner permissions --server-writer` prints", err)
	case holder == "":
		c.info("the seat: vacant; the first instance of serve takes it")
	default:
		c.ok("the seat: held by instance %s since %s", holder, since.UTC().Format(time.RFC3339))
	}
}

func joinedRefusals(refused []string) string {
	if len(refused) == 0 {
		return ""
	}
	return "; " + strings.Join(refused, "; ")
}

func limitOf(bytes int64) string {
	if bytes < 0 {
		return "without a limit"
	}
	return fmt.Sprintf("up to %d MiB", bytes>>20)
}

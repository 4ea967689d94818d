package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/client"
	"github.com/novox/mesh-provisioner/internal/observe/ratelog"
	"github.com/novox/mesh-provisioner/wire"
)

// connectFlags say how to reach an existing NATS, and as whom.
type connectFlags struct {
	url   string
	creds string
	// nkey is a file holding the identity's nkey seed.
	nkey  string
	inbox string
	// apiPrefix is where a node reaches the provisioner's JetStream
	// (wire.RunsAsAPIPrefix in a runs-as mesh); empty: its own account.
	apiPrefix string
	// context is a natscli context: its name, looked up where natscli
	// keeps them, or a file's path.
	context string
	// contextOptions are the context's credentials and TLS settings, as
	// natscli's own library reads them (resolve).
	contextOptions []nats.Option
	resolved       bool
	// urlFrom says where url came from, for the log: "--nats-url", the
	// context, "$NATS_URL" or "the default".
	urlFrom string
}

// defaultClientURL is where the commands that are clients of a mesh look for
// it when nothing names one: where make run serves.
const defaultClientURL = "nats://127.0.0.1:4222"

// The variables natscli reads, which every command reads too, after its own
// flags and variables (resolve).
const (
	envNATSContext = "NATS_CONTEXT"
	envNATSURL     = "NATS_URL"
	envNATSCreds   = "NATS_CREDS"
	envNATSNkey    = "NATS_NKEY"
)

func (c *connectFlags) register(fs *flag.FlagSet, urlUsage string) {
	fs.StringVar(&c.url, "nats-url", "", urlUsage)
	fs.StringVar(&c.creds, "creds", "", "NATS credentials file (user JWT and seed); empty: the context's, then $NATS_CREDS")
	fs.StringVar(&c.nkey, "nkey", "", "file holding the identity's nkey seed; empty: the context's, then $NATS_NKEY")
	fs.StringVar(&c.context, "context", "", "natscli context to connect with: a name, looked up where natscli keeps contexts, or a file's path (mesh-provisioner init writes one per identity); its URL, credentials and inbox prefix count where the flags above are empty; empty: $NATS_CONTEXT")
}

// registerClient registers the flags of a command that is a client of a
// mesh: its URL, credentials, and the inbox prefix of the identity it
// connects as.
func (c *connectFlags) registerClient(fs *flag.FlagSet) {
	c.register(fs, "URL of the mesh's NATS (a comma-separated list tries each); empty: the context's, then $NATS_URL, then "+defaultClientURL)
	fs.StringVar(&c.inbox, "inbox-prefix", "", "inbox prefix of the identity connecting, the one its permissions grant: _INBOX_MESH.node.<node> for node <node>'s credentials, _INBOX_MESH.provider.<module> for a provider's; empty: the context's, else nats.go's _INBOX")
}

// resolve completes what the flags and the command's own variables left
// empty, as natscli does: from the context (--context, else
// $NATS_CONTEXT), then $NATS_URL, $NATS_CREDS and $NATS_NKEY; a URL still
// empty is defaultURL ("" for serve: it embeds a nats-server).
func (c *connectFlags) resolve(lookupEnv func(string) (string, bool), defaultURL string) error {
	if c.resolved {
		return nil
	}
	c.resolved = true
	if c.url != "" {
		c.urlFrom = "--nats-url"
	}
	if c.context == "" {
		c.context, _ = lookupEnv(envNATSContext)
	}
	if c.context != "" {
		if err := c.applyContext(); err != nil {
			return err
		}
		if c.urlFrom == "" && c.url != "" {
			c.urlFrom = "context " + c.context
		}
	}
	if c.url == "" {
		if c.url, _ = lookupEnv(envNATSURL); c.url != "" {
			c.urlFrom = "$" + envNATSURL
		}
	}
	if c.creds == "" && c.nkey == "" && c.contextOptions == nil {
		c.creds, _ = lookupEnv(envNATSCreds)
		if c.creds == "" {
			c.nkey, _ = lookupEnv(envNATSNkey)
		}
	}
	if c.url == "" && defaultURL != "" {
		c.url, c.urlFrom = defaultURL, "the default"
	}
	return nil
}

// applyContext reads c.context with natscli's own library and takes from it
// what the flags left empty: the URL, the inbox prefix, the JetStream API
// prefix, and (unless --creds or --nkey is given) its credentials and TLS.
func (c *connectFlags) applyContext() error {
	nctx, err := loadContext(c.context)
	if err != nil {
		return err
	}
	if c.url == "" {
		c.url = nctx.ServerURL()
	}
	if c.inbox == "" {
		c.inbox = nctx.InboxPrefix()
	}
	if c.apiPrefix == "" {
		c.apiPrefix = nctx.JSAPIPrefix()
	}
	if c.creds == "" && c.nkey == "" {
		// The context's inbox prefix is among its options; an explicit
		// --inbox-prefix, added after them, wins.
		if c.contextOptions, err = nctx.NATSOptions(); err != nil {
			return fmt.Errorf("--context %s: %w", c.context, err)
		}
	}
	return nil
}

// loadContext reads a natscli context: a path to its file when name holds a
// path separator or ends in .json, else the context natscli knows by name.
func loadContext(name string) (*natscontext.Context, error) {
	if strings.ContainsRune(name, filepath.Separator) || strings.HasSuffix(name, ".json") {
		nctx, err := natscontext.NewFromFile(name)
		if err != nil {
			return nil, fmt.Errorf("--context %s: %w", name, err)
		}
		return nctx, nil
	}
	if !natscontext.IsKnown(name) {
		return nil, fmt.Errorf("--context %s: natscli knows no context of that name (nats context ls lists them); give a context file's path instead", name)
	}
	nctx, err := natscontext.New(name, true)
	if err != nil {
		return nil, fmt.Errorf("--context %s: %w", name, err)
	}
	return nctx, nil
}

// registerAPIPrefix registers the flag of a command that reaches the
// provisioner's buckets as a node: put, and query compose --watch.
func (c *connectFlags) registerAPIPrefix(fs *flag.FlagSet, usage string) {
	fs.StringVar(&c.apiPrefix, "api-prefix", "", usage+": "+wire.RunsAsAPIPrefix+" in a mesh whose server runs in an account of its own (permissions --runs-as); empty: the node's own account")
}

// clientOptions are the client's options for the identity connecting: a
// node's inbox prefix makes it ask as that node, on its own subjects.
func (c *connectFlags) clientOptions() []client.Option {
	var opts []client.Option
	if node := c.node(); node != "" {
		opts = append(opts, client.AsNode(node))
	}
	if c.apiPrefix != "" {
		opts = append(opts, client.WithAPIPrefix(c.apiPrefix))
	}
	return opts
}

// node returns the node whose inbox prefix the identity connects with, or "".
func (c *connectFlags) node() string {
	node, _ := strings.CutPrefix(c.inbox, wire.InboxPrefix(wire.RoleNode, ""))
	if node == c.inbox {
		return ""
	}
	return node
}

// clientConn is a client command's connection: the connection, the
// permission violations NATS reported on it, and close.
type clientConn struct {
	*nats.Conn
	violations *violations
	closed     chan struct{}
}

// openClient starts a client command: its logger, and a connection as name.
// The context it returns ends when timeout (if any) passes, or at once when
// NATS refuses the command's reply inbox or verb (see violations); done
// releases both, the connection last.
func openClient(ctx context.Context, inv invocation, logs *logFlags, conn *connectFlags, name string, timeout time.Duration) (*clientConn, context.Context, func(), error) {
	logger, err := logs.logger(inv.stderr)
	if err != nil {
		return nil, nil, nil, err
	}
	warnAll(logger, inv.warnings)
	if err := conn.resolve(inv.lookupEnv, defaultClientURL); err != nil {
		return nil, nil, nil, err
	}
	nc, err := conn.connectClient(ctx, name, logger)
	if err != nil {
		return nil, nil, nil, err
	}
	cancel := context.CancelFunc(func() {})
	if timeout > 0 {
		ctx, cancel = context.WithTimeout(ctx, timeout)
	}
	ctx, stop := nc.violations.whileWatching(ctx)
	return nc, ctx, func() { stop(); cancel(); nc.close() }, nil
}

// close closes the connection and waits for nats.go's last event, so that
// no log line follows the command's end.
func (c *clientConn) close() {
	c.Close()
	select {
	case <-c.closed:
	case <-time.After(time.Second):
	}
}

// connectClient connects a client command: one attempt, failures returned
// as its error, nats.go's events logged, and permission violations watched
// so that a refused request can say why.
func (c *connectFlags) connectClient(ctx context.Context, name string, logger *slog.Logger) (*clientConn, error) {
	conn := &clientConn{violations: newViolations(c.inbox), closed: make(chan struct{})}
	nc, err := c.connect(ctx, c.url, name, logger, connectEvents{onViolation: conn.violations.record, onClosed: func() { close(conn.closed) }})
	if err != nil {
		return nil, err
	}
	conn.Conn = nc
	return conn, nil
}

// connectEvents are what a connection's owner learns besides the log.
type connectEvents struct {
	// onViolation receives each permission violation the server reports; it
	// is logged at debug when set (its owner says what it means), else at
	// error.
	onViolation func(error)
	// onRefused counts each permission violation that is logged (at most
	// once a minute) rather than handed to onViolation: serve's metric.
	onRefused func()
	// onClosed runs once the connection is closed for good.
	onClosed func()
	// retry keeps trying to connect, logging each attempt, instead of
	// failing when no server of the URL answers at first.
	retry bool
}

// Reconnect pacing: a short, jittered wait after each round through the URL
// list, growing to at most reconnectMaxWait, so that a NATS that comes back
// is rejoined well within a second (the copy must be fresh within 2 s of
// it) and a NATS restarting under many clients is not met by all of them
// at once.
const (
	reconnectFirstWait = 100 * time.Millisecond
	reconnectMaxWait   = 500 * time.Millisecond
	reconnectJitter    = 250 * time.Millisecond
)

// reconnectDelay is the wait after the rounds-th round through the URL list
// found no server.
func reconnectDelay(rounds int) time.Duration {
	wait := reconnectFirstWait << min(rounds-1, 8)
	return min(wait, reconnectMaxWait) + rand.N(reconnectJitter)
}

// connect opens a connection to url (a comma-separated list: any of them)
// with the credentials given. nats.go's events go to logger: disconnections
// and asynchronous errors at warn or error, reconnections at info. Without
// events.retry it fails within a few seconds when no server can be reached.
func (c *connectFlags) connect(ctx context.Context, url, name string, logger *slog.Logger, events connectEvents, extra ...nats.Option) (*nats.Conn, error) {
	// What a node can cause on this connection (a publish the identity's
	// permissions refuse, for a bucket a need names; a slow consumer) is
	// logged once a minute a cause, with the count kept back.
	asyncErrors := ratelog.New(logger, ratelog.Period)
	opts := append([]nats.Option{
		nats.Name(name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.CustomReconnectDelay(reconnectDelay),
		nats.RetryOnFailedConnect(events.retry),
		nats.ConnectHandler(func(nc *nats.Conn) {
			level := slog.LevelDebug
			if nc.Stats().Reconnects > 0 {
				level = slog.LevelInfo // after failed attempts, each of them logged
			}
			logger.Log(ctx, level, "connected to NATS", "url", nc.ConnectedUrlRedacted())
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if err != nil {
				logger.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			if errors.Is(err, nats.ErrNoServers) {
				return // the first failure at start, already logged below
			}
			logger.Warn("NATS not reachable; trying again shortly", "url", redactURL(url), "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { logger.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted()) }),
		nats.DiscoveredServersHandler(func(nc *nats.Conn) {
			logger.Info("NATS announced more servers", "servers", redactURL(strings.Join(nc.DiscoveredServers(), ",")))
		}),
		nats.LameDuckModeHandler(func(nc *nats.Conn) {
			logger.Warn("the NATS server is shutting down (lame duck mode); moving to another", "url", nc.ConnectedUrlRedacted())
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			if err := nc.LastError(); err != nil {
				logger.Warn("NATS connection closed", "err", err)
			} else {
				logger.Debug("NATS connection closed")
			}
			if events.onClosed != nil {
				events.onClosed()
			}
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			attrs := []any{"err", err}
			if sub != nil {
				attrs = append(attrs, "subject", sub.Subject)
			}
			switch {
			case errors.Is(err, nats.ErrPermissionViolation) && events.onViolation != nil:
				events.onViolation(err)
				logger.Debug("NATS refused a publish or subscription", attrs...)
			case errors.Is(err, nats.ErrPermissionViolation):
				if events.onRefused != nil {
					events.onRefused()
				}
				asyncErrors.Log(slog.LevelError, "permission violation", "", "NATS refused a publish or subscription: check this identity's permissions", attrs...)
			case errors.Is(err, nats.ErrSlowConsumer) && sub != nil && strings.HasPrefix(sub.Subject, wire.ServiceName+"."):
				// The service counts a flood's drops and logs them once per
				// burst; here they would be logged for every report.
				logger.Debug("slow consumer on a verb's subscription", attrs...)
			case errors.Is(err, nats.ErrSlowConsumer):
				asyncErrors.Log(slog.LevelWarn, "slow consumer", "", "slow consumer: NATS dropped messages this process did not read in time", attrs...)
			default:
				asyncErrors.Log(slog.LevelWarn, "async error", "", "NATS reported an error", attrs...)
			}
		}),
	}, extra...)
	opts = append(opts, c.contextOptions...)
	if c.creds != "" {
		opts = append(opts, nats.UserCredentials(c.creds))
	}
	if c.nkey != "" {
		opt, err := nats.NkeyOptionFromSeed(c.nkey)
		if err != nil {
			return nil, fmt.Errorf("--nkey %s: %w", c.nkey, err)
		}
		opts = append(opts, opt)
	}
	if c.inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.inbox))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrNoServers) {
			return nil, fmt.Errorf("cannot reach NATS at %s: %w", redactURL(url), err)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", redactURL(url), scrubbed(err, url))
	}
	if !nc.IsConnected() {
		logger.Warn("NATS not reachable; trying again until it is", "url", redactURL(url))
	}
	return nc, nil
}

// waitConnected waits until nc has connected, for a connection made with
// retries, or ctx ends.
func waitConnected(ctx context.Context, nc *nats.Conn) error {
	if nc.IsConnected() {
		return nil
	}
	status := nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	defer nc.RemoveStatusListener(status)
	for !nc.IsConnected() {
		select {
		case <-status:
			if nc.IsClosed() {
				if err := nc.LastError(); err != nil {
					return fmt.Errorf("gave up connecting: %w", err)
				}
				return errors.New("the connection closed before it connected")
			}
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second): // a status change before the listener was added
		}
	}
	return nil
}

// scrubbed returns err with any password or token of urls replaced: an
// error from nats.go may quote the URL it was given.
func scrubbed(err error, urls string) error {
	text := err.Error()
	clean := text
	for _, part := range strings.Split(urls, ",") {
		u, perr := url.Parse(strings.TrimSpace(part))
		if perr != nil || u.User == nil {
			continue
		}
		if pw, ok := u.User.Password(); ok && pw != "" {
			clean = strings.ReplaceAll(clean, pw, "xxxxx")
		} else if tok := u.User.Username(); tok != "" && !ok {
			clean = strings.ReplaceAll(clean, tok, "xxxxx")
		}
	}
	if clean == text {
		return err
	}
	return errors.New(clean) // not wrapped: the original holds the secret
}

// redactURL returns a NATS URL, or a comma-separated list of them, with any
// password or token replaced by "xxxxx": fit for logs and errors.
func redactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, part := range parts {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil {
			if strings.Contains(part, "@") {
				parts[i] = "(a URL that does not parse)"
			}
			continue
		}
		if u.User == nil {
			continue
		}
		if _, hasPassword := u.User.Password(); hasPassword {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		} else {
			u.User = url.User("xxxxx") // a lone user part is a token
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

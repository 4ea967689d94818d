package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
)

// connectFlags say how to reach an existing NATS.
type connectFlags struct {
	url   string
	creds string
	inbox string
}

// defaultClientURL is where the commands that are clients of a mesh look for
// it: where make run serves.
const defaultClientURL = "nats://127.0.0.1:4222"

func (c *connectFlags) register(fs *flag.FlagSet, defaultURL, urlUsage string) {
	fs.StringVar(&c.url, "nats-url", defaultURL, urlUsage)
	fs.StringVar(&c.creds, "creds", "", "NATS credentials file (user JWT and seed) for --nats-url")
}

// registerClient registers the flags of a command that is a client of a
// mesh: its URL, credentials, and the inbox prefix of the identity it
// connects as.
func (c *connectFlags) registerClient(fs *flag.FlagSet) {
	c.register(fs, defaultClientURL, "URL of the mesh's NATS")
	fs.StringVar(&c.inbox, "inbox-prefix", "", "inbox prefix of the identity connecting, such as _INBOX_ace for node ace's credentials")
}

// connectClient connects a client command, quietly: it reports failures as
// its error.
func (c *connectFlags) connectClient(name string) (*nats.Conn, error) {
	return c.connect(c.url, name, slog.New(slog.DiscardHandler))
}

// connect opens a connection to url with the credentials given, failing
// within a few seconds when the server cannot be reached.
func (c *connectFlags) connect(url, name string, logger *slog.Logger, extra ...nats.Option) (*nats.Conn, error) {
	opts := append([]nats.Option{
		nats.Name(name),
		nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				logger.Warn("disconnected from NATS; reconnecting", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { logger.Info("reconnected to NATS", "url", nc.ConnectedUrlRedacted()) }),
	}, extra...)
	if c.creds != "" {
		opts = append(opts, nats.UserCredentials(c.creds))
	}
	if c.inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(c.inbox))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrNoServers) {
			return nil, fmt.Errorf("cannot reach NATS at %s: %w", redactURL(url), err)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", redactURL(url), err)
	}
	return nc, nil
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

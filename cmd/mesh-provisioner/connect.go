package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
)

// connectFlags say how to reach an existing NATS.
type connectFlags struct {
	url   string
	creds string
}

func (c *connectFlags) register(fs *flag.FlagSet, urlUsage string) {
	fs.StringVar(&c.url, "nats-url", "", urlUsage)
	fs.StringVar(&c.creds, "creds", "", "NATS credentials file (user JWT and seed) for --nats-url")
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
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrNoServers) {
			return nil, fmt.Errorf("cannot reach NATS at %s: %w", url, err)
		}
		return nil, fmt.Errorf("connect to NATS at %s: %w", url, err)
	}
	return nc, nil
}

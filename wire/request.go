package wire

import (
	"context"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
)

// Request sends msg, a request on an identity's own subject, and waits for
// its answer on an inbox of that identity's (InboxPrefix(role, name)): the
// only one the service answers such a request to. On a connection made
// with that inbox prefix, which an identity's permissions require, it is
// nats.go's request; on another (a test's or a simulation's, asking for
// many nodes on one connection), it subscribes to an inbox of the
// identity's for this request alone. An empty name is a request on a
// verb's bare subject: nats.go's request, on the connection's inbox.
func Request(ctx context.Context, nc *nats.Conn, role Role, name string, msg *nats.Msg) (*nats.Msg, error) {
	prefix := InboxPrefix(role, name)
	if name == "" || nc.Opts.InboxPrefix == prefix {
		return nc.RequestMsgWithContext(ctx, msg)
	}
	inbox := prefix + "." + nuid.Next()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	msg.Reply = inbox
	if err := nc.PublishMsg(msg); err != nil {
		return nil, err
	}
	reply, err := sub.NextMsgWithContext(ctx)
	if err != nil {
		return nil, err
	}
	// As nats.go's request: a status 503 without a body is nats-server
	// saying no one subscribes to the subject.
	if len(reply.Data) == 0 && reply.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return reply, nil
}

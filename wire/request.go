package wire

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nuid"
	"google.golang.org/protobuf/proto"
)

// Call sends req in protobuf binary to subject, an identity's own (role and
// name; no name: a verb's bare subject), answered on that identity's inbox
// (Request), and decodes the answer into answer; a refusal is an *Error.
func Call(ctx context.Context, nc *nats.Conn, role Role, name, subject string, req, answer proto.Message) error {
	data, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set("Content-Type", ContentTypeProtobuf)
	reply, err := Request(ctx, nc, role, name, msg)
	if err != nil {
		return err
	}
	if err := ErrorOf(reply); err != nil {
		return err
	}
	if err := proto.Unmarshal(reply.Data, answer); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

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
	// One answer is awaited: a channel of one, where a synchronous
	// subscription would make one of the connection's SubChanLen (64 Ki
	// messages, 512 KiB cleared for each request).
	// nats.go closes no such channel when the connection closes: the
	// subscription's closed handler says so.
	replies, closed := make(chan *nats.Msg, 1), make(chan struct{})
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		return nil, err
	}
	var once sync.Once
	sub.SetClosedHandler(func(string) { once.Do(func() { close(closed) }) })
	defer func() { _ = sub.Unsubscribe() }()
	msg.Reply = inbox
	if err := nc.PublishMsg(msg); err != nil {
		return nil, err
	}
	var reply *nats.Msg
	select {
	case reply = <-replies:
	case <-closed:
		return nil, nats.ErrConnectionClosed
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	// As nats.go's request: a status 503 without a body is nats-server
	// saying no one subscribes to the subject.
	if len(reply.Data) == 0 && reply.Header.Get("Status") == "503" {
		return nil, nats.ErrNoResponders
	}
	return reply, nil
}

// RequestAgain is Request for a request that only reads, sent once more if
// again passes without an answer, the first answer of either returned: a
// responder that died with the request in hand never answers it, and by
// then nats-server has forgotten its subscriptions and sends the second to
// another; a responder merely slow is answered by whichever is first.
func RequestAgain(ctx context.Context, nc *nats.Conn, role Role, name string, msg *nats.Msg, again time.Duration) (*nats.Msg, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel() // the request still out is given up
	type answer struct {
		msg *nats.Msg
		err error
	}
	answers := make(chan answer, 2)
	ask := func() {
		// A message of its own each: Request sets its reply.
		reply, err := Request(ctx, nc, role, name, &nats.Msg{Subject: msg.Subject, Header: msg.Header, Data: msg.Data})
		answers <- answer{reply, err}
	}
	go ask()
	timer := time.NewTimer(again)
	defer timer.Stop()
	select {
	case a := <-answers:
		return a.msg, a.err
	case <-timer.C:
	}
	go ask()
	a := <-answers
	return a.msg, a.err
}

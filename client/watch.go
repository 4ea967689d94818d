package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/backoff"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// ErrWatchStopped is returned by WatchPlan when the connection closes
// before ctx is done.
var ErrWatchStopped = errors.New("client: the plan's watch stopped: the connection closed")

// How WatchPlan asks again after a 503 (the copy still loading, or behind
// the revisions the digest names), or reads the node's key again after an
// error once reconnected: doubling from watchRetryMin to watchRetryMax,
// not jittered.
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 2 * time.Second
	// watchFlushTimeout bounds the round trip that puts the subscription
	// in place, as long as jetstream's default for an API request.
	watchFlushTimeout = 5 * time.Second
	// watchComposeTimeout bounds one composition the watch asks, every
	// page of it: a request lost with its connection, or with the
	// instance that took it, is asked again, not waited for as long as
	// the watch lasts.
	watchComposeTimeout = 30 * time.Second
)

// unanswered reports whether a request got no answer, and may get one if
// asked again: no instance served its subject (one starting, or the node
// before the service), it timed out, or its connection was lost.
func unanswered(err error) bool {
	return errors.Is(err, nats.ErrNoResponders) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionReconnecting)
}

// WatchPlan composes node whole, then again each time the node's plan
// digest changes, and calls fn with each composition whose digest differs
// from the last one's, the first always. The seat's holder keeps every
// node's digest in mesh-provisioner_plans (keyed <node>, with the revisions
// it was composed at, which the composition asks for: it is at least as
// new). Each write of the node's key is a message on the key's subject, to
// which WatchPlan subscribes; the composition asked first, and again after
// each reconnect, covers what the subscription cannot have heard. A
// subscription is all a node's permissions grant of the bucket: no
// consumer, no direct get, nothing published into JetStream
// (docs/security.md). Only a message that is a write of the node's own key
// is heard: one that JetStream answered on that subject for someone else
// (it carries Nats-Stream or another key's Nats-Subject) is not. Nothing
// changed costs no request.
//
// It returns nil when ctx is done, fn's error when fn returns one,
// ErrWatchStopped when the connection closes, and an error when a
// composition is refused otherwise than with a 503. A 503, and a
// composition that got no answer (no instance serving yet, a timeout, the
// connection lost meanwhile), is asked again, backing off. A connection
// lost and found again composes again: a change made meanwhile is not
// missed.
func (c *Client) WatchPlan(ctx context.Context, node string, fn func(*provisionerv1.ComposeResponse) error) error {
	// A node is a token of at most keys.MaxNameLen bytes (the rule of
	// keys.NodeFilter, as nodeclient.New checks it): one with a wildcard
	// would subscribe to every node's key it may read.
	if err := keys.CheckLength("the node", node); err != nil {
		return fmt.Errorf("client: watch %q's plan: %w", keys.Echo(node), err)
	}
	if err := keys.CheckToken(node); err != nil {
		return fmt.Errorf("client: watch %q's plan: the node %w", keys.Echo(node), err)
	}
	w, err := c.watchPlan(ctx, node)
	if err != nil {
		return fmt.Errorf("client: watch %s's plan: %w", node, err)
	}
	defer w.stop()

	last := ""
	composeAt := func(least *provisionerv1.Revisions) error {
		retry := backoff.New(backoff.Config{Min: watchRetryMin, Max: watchRetryMax, Factor: 2})
		for {
			ask, cancel := context.WithTimeout(ctx, watchComposeTimeout)
			composition, err := c.ComposeAll(ask, &provisionerv1.ComposeRequest{Node: node, MinRevisions: least})
			cancel()
			switch {
			case err == nil:
				if composition.GetPlanDigest() == last {
					return nil
				}
				last = composition.GetPlanDigest()
				return fn(composition)
			case ctx.Err() != nil:
				return nil
			case w.nc.IsClosed():
				return ErrWatchStopped
			case wire.CodeOf(err) != wire.CodeUnavailable && !unanswered(err):
				return err
			}
			if !retry.Wait(ctx) {
				return nil
			}
		}
	}
	if err := composeAt(nil); err != nil || ctx.Err() != nil {
		return err
	}
	for {
		select {
		case <-ctx.Done():
			return nil
		case status := <-w.status:
			if status == nats.CLOSED {
				return ErrWatchStopped
			}
			// Reconnected: what was written meanwhile was not heard.
			if err := composeAt(nil); err != nil || ctx.Err() != nil {
				return err
			}
		case <-w.heard:
			record := w.latest()
			if record == nil || record.GetDigest() == last {
				continue
			}
			if err := composeAt(record.GetRevisions()); err != nil || ctx.Err() != nil {
				return err
			}
		}
	}
}

// planWatch is what WatchPlan hears of a node's key of the plans bucket:
// the writes of it, the latest kept (a burst of writes is one change to
// compose), and the connection's reconnects and close.
type planWatch struct {
	node   string
	sub    *nats.Subscription
	nc     *nats.Conn
	status chan nats.Status
	heard  chan struct{}

	mu   sync.Mutex
	last *nats.Msg
}

// watchPlan subscribes to node's key: a write after the first composition
// is heard.
func (c *Client) watchPlan(ctx context.Context, node string) (*planWatch, error) {
	w := &planWatch{node: node, nc: c.nc, heard: make(chan struct{}, 1)}
	subject := wire.KVSubject(keys.PlansBucket, node)
	if c.apiPrefix != "" {
		subject = c.apiPrefix + "." + subject
	}
	sub, err := c.nc.Subscribe(subject, func(m *nats.Msg) {
		if !ownWrite(m, subject) {
			return
		}
		w.mu.Lock()
		w.last = m
		w.mu.Unlock()
		select {
		case w.heard <- struct{}{}:
		default:
		}
	})
	if err != nil {
		return nil, err
	}
	w.sub = sub
	w.status = c.nc.StatusChanged(nats.CONNECTED, nats.CLOSED)
	// FlushWithContext needs a deadline, which a watch's ctx seldom has.
	flushCtx, cancel := context.WithTimeout(ctx, watchFlushTimeout)
	defer cancel()
	if err := c.nc.FlushWithContext(flushCtx); err != nil {
		w.stop()
		return nil, err
	}
	return w, nil
}

// ownWrite reports whether m is a write of the key whose subject is
// subject, as the stream publishes it: not an answer of JetStream's aimed
// there (a direct get's carries Nats-Stream, a publish acknowledgement is
// JSON that decodes as no digest), nor a message of another key's.
func ownWrite(m *nats.Msg, subject string) bool {
	if m.Subject != subject {
		return false
	}
	if m.Header == nil {
		return true
	}
	if m.Header.Get(jetstream.StreamHeader) != "" {
		return false
	}
	if s := m.Header.Get(jetstream.SubjectHeader); s != "" && s != subject {
		return false
	}
	return true
}

func (w *planWatch) stop() {
	_ = w.sub.Unsubscribe()
	w.nc.RemoveStatusListener(w.status)
}

// latest returns the record of the last write heard, nil when it removed
// the key or holds no digest.
func (w *planWatch) latest() *provisionerv1.PlanDigest {
	w.mu.Lock()
	m := w.last
	w.mu.Unlock()
	if m == nil {
		return nil
	}
	if wire.KVRemoves(m.Header) {
		return nil // the node's key removed: its plan is what it was
	}
	return decodePlanDigest(m.Data)
}

// decodePlanDigest decodes a record, or nil for one that is not a digest:
// the next write will be.
func decodePlanDigest(value []byte) *provisionerv1.PlanDigest {
	digest := &provisionerv1.PlanDigest{}
	if proto.Unmarshal(value, digest) != nil || digest.GetDigest() == "" {
		return nil
	}
	return digest
}

package client

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// ErrWatchStopped is returned by WatchPlan when the bucket's watcher ends
// before ctx does.
var ErrWatchStopped = errors.New("client: the plan's watcher stopped")

// How WatchPlan asks again after a 503 (the copy still loading, or behind
// the revisions the digest names).
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 2 * time.Second
)

// WatchPlan composes node whole, then again each time the node's plan
// digest changes, and calls fn with each composition whose digest differs
// from the last one's, the first always. The seat's holder keeps every
// node's digest in mesh-provisioner_plans (keyed <node>, with the revisions
// it was composed at, which the composition asks for: it is at least as
// new); WatchPlan watches the node's key there, which is all a node's
// permissions let it watch. Nothing changed costs no request.
//
// It returns nil when ctx is done, fn's error when fn returns one, and an
// error when the bucket cannot be watched or a composition fails otherwise
// than with a 503 (asked again, backing off). A connection lost and found
// again is resumed by the KV watcher, which delivers the key's value
// anew: a change made meanwhile is not missed.
func (c *Client) WatchPlan(ctx context.Context, node string, fn func(*provisionerv1.ComposeResponse) error) error {
	js, err := jetstream.New(c.nc)
	if err != nil {
		return err
	}
	kv, err := js.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		return fmt.Errorf("client: watch %s's plan: %w", node, err)
	}
	watcher, err := kv.Watch(ctx, node)
	if err != nil {
		return fmt.Errorf("client: watch %s's plan: %w", node, err)
	}
	defer kvread.Stop(watcher)

	last := ""
	composeAt := func(least *provisionerv1.Revisions) error {
		for retry := watchRetryMin; ; retry = min(2*retry, watchRetryMax) {
			composition, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: least})
			switch {
			case err == nil:
				if composition.GetPlanDigest() == last {
					return nil
				}
				last = composition.GetPlanDigest()
				return fn(composition)
			case wire.CodeOf(err) != wire.CodeUnavailable:
				return err
			}
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(retry):
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
		case e, ok := <-watcher.Updates():
			if !ok {
				if ctx.Err() != nil {
					return nil
				}
				return ErrWatchStopped
			}
			if e == nil || e.Operation() != jetstream.KeyValuePut {
				continue // the current value is in; or the node's key removed
			}
			digest := &provisionerv1.PlanDigest{}
			if err := proto.Unmarshal(e.Value(), digest); err != nil || digest.GetDigest() == last {
				continue
			}
			if err := composeAt(digest.GetRevisions()); err != nil || ctx.Err() != nil {
				return err
			}
		}
	}
}

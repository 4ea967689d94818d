package mirror

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/kvread"
)

// ErrNodeUnread says ReadNode or ReadNodeBound did not read a node: what
// it reads beside the node's keys is not loaded yet, or the node reads more
// than a read of its own may (it is over its budget, its needs name too
// many providers' buckets, or one holds more than Bound.SetMaxKeys). Its
// answers wait for the whole copy.
var ErrNodeUnread = errors.New("the node is not read alone")

// ReadNode reads one node's keys straight from its buckets, for an answer
// while the copy loads: it returns a mirror that holds the node's needs,
// applied records and items, each copy at the revision its bucket had when
// it was read, beside m's own registry and manifests, which must be loaded,
// and no provider's bucket (ReadNodeBound reads those). What it answers of
// the node is what the whole copy answers at those revisions, malformed
// keys included; a node over its budget in a bucket is not read.
//
// Each bucket is read by KV watchers of the node's keys alone, stopped once
// they are in. A bucket's revision is read first, so that the keys read are
// at least as new.
func (m *Mirror) ReadNode(ctx context.Context, js jetstream.JetStream, node string) (*Mirror, error) {
	if !m.Registry.Ready() || !m.Manifests.Ready() {
		return nil, fmt.Errorf("%w: the copy of the registry or of the manifests is still loading", ErrNodeUnread)
	}
	read := New()
	read.Registry, read.Manifests, read.manifests = m.Registry, m.Manifests, m.manifests
	read.Bound.held, read.Bound.maxKeys = true, m.Bound.maxKeys
	var reading errgroup.Group
	reading.Go(func() error { return readNodeInto(ctx, js, node, m.Needs, read.Needs) })
	reading.Go(func() error { return readNodeInto(ctx, js, node, m.Applied, read.Applied) })
	reading.Go(func() error { return readNodeInto(ctx, js, node, m.Collect, read.Collect) })
	if err := reading.Wait(); err != nil {
		return nil, err
	}
	return read, nil
}

// ReadNodeBound reads, into a mirror ReadNode returned, node's keys in the
// bucket of each provider its needs name, at most maxBound buckets, as
// ReadNode reads the state buckets: a provider's bucket's key shape begins
// with <node> (registry.Validate).
func (m *Mirror) ReadNodeBound(ctx context.Context, js jetstream.JetStream, node string, maxBound int) error {
	buckets := m.BoundBuckets()
	if len(buckets) > maxBound {
		return fmt.Errorf("%w: its needs name %d providers' buckets, more than the %d read alone", ErrNodeUnread, len(buckets), maxBound)
	}
	// At once: a bucket the identity may not read goes unanswered for
	// apiTimeout, as many as the needs name.
	var providers errgroup.Group
	for _, bucket := range buckets {
		providers.Go(func() error {
			keys := map[string]uint64{}
			revision, err := readKeys(ctx, js, bucket, node, true, m.Bound.maxKeys, func(key string, _ []byte, revision uint64) bool {
				keys[key] = revision
				return true
			})
			switch {
			case errors.Is(err, jetstream.ErrBucketNotFound):
				// Missing: held empty, as the copy holds a missing bucket.
			case errors.Is(err, ErrNodeUnread), ctx.Err() != nil:
				return fmt.Errorf("read %s of node %s: %w", bucket, node, err)
			case err != nil:
				// As the copy holds a bucket it fails to read: its
				// provisions pending, the bucket behind.
				m.Bound.Bucket(bucket).markFailing(true)
			default:
				m.Bound.Bucket(bucket).replace(keys, revision)
			}
			return nil
		})
	}
	return providers.Wait()
}

// readNodeInto reads node's keys of a provisioning bucket into into, held
// within from's budget, at the bucket's revision.
func readNodeInto[R proto.Message](ctx context.Context, js jetstream.JetStream, node string, from, into *Copy[R]) error {
	from.mu.RLock()
	budget := from.budget
	from.mu.RUnlock()
	into.SetBudget(budget, nil)
	// A node over its budget is not read alone: its keys beyond the
	// budget are as many as it wrote, each read on every request.
	revision, err := readKeys(ctx, js, into.Bucket(), node, false, 0, func(key string, value []byte, revision uint64) bool {
		into.Apply(key, value, revision, false)
		return !into.overBudget(node)
	})
	if err != nil {
		return fmt.Errorf("read %s of node %s: %w", into.Bucket(), node, err)
	}
	into.mu.Lock()
	into.advanceTo(revision)
	into.mu.Unlock()
	into.MarkLoaded()
	return nil
}

// overBudget says whether the group first is over its budget.
func (c *Copy[R]) overBudget(first string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.overSet[first] != nil
}

// readKeys reads the live keys of node in bucket, in the order they were
// written, and returns the bucket's revision read before them: through a
// KV watcher, as the copy reads a bucket whole, on the identity's grants
// for it. metaOnly reads no values (as the copy reads a provider's
// bucket); with maxKeys above zero, a bucket that holds more messages than
// maxKeys is not read (ErrNodeUnread): the copy may not hold it
// (Bound.SetMaxKeys).
func readKeys(ctx context.Context, js jetstream.JetStream, bucket, node string, metaOnly bool, maxKeys int, each func(key string, value []byte, revision uint64) bool) (uint64, error) {
	apiCtx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	kv, err := js.KeyValue(apiCtx, bucket)
	if err != nil {
		return 0, err
	}
	status, err := kv.Status(apiCtx)
	if err != nil {
		return 0, err
	}
	state := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State
	if maxKeys > 0 && state.Msgs > uint64(maxKeys) {
		return 0, fmt.Errorf("%w: %s holds %d messages, more than the %d keys the copy holds of a provider's bucket", ErrNodeUnread, bucket, state.Msgs, maxKeys)
	}
	var opts []jetstream.WatchOpt
	if metaOnly {
		opts = append(opts, jetstream.MetaOnly())
	}
	// A key that is the node's name alone (malformed, listed with the
	// node's), then the node's keys as they arrive, each through a watcher
	// of one filter (kvread.LiveOf), taken in the order they were written,
	// as the copy takes them.
	alone, err := kvread.LiveOf(ctx, kv, node, opts...)
	if err != nil {
		return 0, err
	}
	err = kvread.Each(ctx, kv, node+".>", func(e jetstream.KeyValueEntry) bool {
		if len(alone) > 0 && alone[0].Revision() < e.Revision() {
			if !each(alone[0].Key(), alone[0].Value(), alone[0].Revision()) {
				return false
			}
			alone = nil
		}
		return each(e.Key(), e.Value(), e.Revision())
	}, opts...)
	if err == nil && len(alone) > 0 && !each(alone[0].Key(), alone[0].Value(), alone[0].Revision()) {
		err = kvread.ErrStopped
	}
	if errors.Is(err, kvread.ErrStopped) {
		return 0, fmt.Errorf("%w: the node is over its budget in %s (serve --node-max-keys, --node-max-bytes)", ErrNodeUnread, bucket)
	}
	if err != nil {
		return 0, err
	}
	return state.LastSeq, nil
}

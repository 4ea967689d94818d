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
// it was read, beside the copy's own registry and manifests, which must be
// loaded, and no provider's bucket (ReadNodeBound reads those). What it
// answers of the node is what the whole copy answers at those revisions,
// malformed keys included; a node over its budget in a bucket is not read.
//
// Each bucket, bound once by Open, is read in two requests: its state,
// which gives its revision (read first, so that the keys read are at
// least as new) and says whether a key is the node's name alone, then a KV
// watcher of the node's keys, stopped once they are in.
func (w *Watchers) ReadNode(ctx context.Context, node string) (*Mirror, error) {
	m := w.mirror
	if !m.Registry.Ready() || !m.Manifests.Ready() {
		return nil, fmt.Errorf("%w: the copy of the registry or of the manifests is still loading", ErrNodeUnread)
	}
	read := New()
	read.Registry, read.Manifests, read.manifests = m.Registry, m.Manifests, m.manifests
	read.Bound.held, read.Bound.maxKeys = true, m.Bound.maxKeys
	var reading errgroup.Group
	reading.Go(func() error { return readNodeInto(ctx, w.followerOf(m.Needs), node, m.Needs, read.Needs) })
	reading.Go(func() error { return readNodeInto(ctx, w.followerOf(m.Applied), node, m.Applied, read.Applied) })
	reading.Go(func() error { return readNodeInto(ctx, w.followerOf(m.Collect), node, m.Collect, read.Collect) })
	if err := reading.Wait(); err != nil {
		return nil, err
	}
	return read, nil
}

// followerOf returns the follower of a copy.
func (w *Watchers) followerOf(c followed) *follower {
	for _, f := range w.followers {
		if f.copy == c {
			return f
		}
	}
	panic("mirror: no follower of bucket " + c.Bucket())
}

// readNodeInto reads node's keys of a provisioning bucket into into, held
// within from's budget, at the bucket's revision. A node over its budget
// is not read alone: its keys beyond the budget are as many as it wrote,
// each read on every request.
func readNodeInto[R proto.Message](ctx context.Context, f *follower, node string, from, into *Copy[R]) error {
	from.mu.RLock()
	budget := from.budget
	from.mu.RUnlock()
	into.SetBudget(budget, nil)
	apiCtx, cancel := context.WithTimeout(ctx, apiTimeout)
	info, err := f.stream.Info(apiCtx, jetstream.WithSubjectFilter(f.prefix+node))
	cancel()
	if err != nil {
		return fmt.Errorf("read %s of node %s: %w", into.Bucket(), node, err)
	}
	// A key that is the node's name alone is malformed, and listed with
	// the node's: read when there is one.
	var alone []jetstream.KeyValueEntry
	if len(info.State.Subjects) > 0 {
		if alone, err = kvread.LiveOf(ctx, f.kv, node); err != nil {
			return fmt.Errorf("read %s of node %s: %w", into.Bucket(), node, err)
		}
	}
	err = eachKey(ctx, f.kv, node, alone, nil, func(key string, value []byte, revision uint64) bool {
		into.Apply(key, value, revision, false)
		return !into.overBudget(node)
	})
	if errors.Is(err, kvread.ErrStopped) {
		return fmt.Errorf("%w: the node is over its budget in %s (serve --node-max-keys, --node-max-bytes)", ErrNodeUnread, into.Bucket())
	}
	if err != nil {
		return fmt.Errorf("read %s of node %s: %w", into.Bucket(), node, err)
	}
	into.mu.Lock()
	into.advanceTo(info.State.LastSeq)
	into.mu.Unlock()
	into.MarkLoaded()
	return nil
}

// eachKey hands each live key of node in kv to each, in the order they
// were written, through a KV watcher of one filter, <node>.> (kvread.LiveOf
// says why one), with the entries of alone (read apart) in their place,
// until each returns false (kvread.ErrStopped).
func eachKey(ctx context.Context, kv jetstream.KeyValue, node string, alone []jetstream.KeyValueEntry, opts []jetstream.WatchOpt, each func(key string, value []byte, revision uint64) bool) error {
	take := func(e jetstream.KeyValueEntry) bool { return each(e.Key(), e.Value(), e.Revision()) }
	err := kvread.Each(ctx, kv, node+".>", func(e jetstream.KeyValueEntry) bool {
		for len(alone) > 0 && alone[0].Revision() < e.Revision() {
			if !take(alone[0]) {
				return false
			}
			alone = alone[1:]
		}
		return take(e)
	}, opts...)
	for ; err == nil && len(alone) > 0; alone = alone[1:] {
		if !take(alone[0]) {
			err = kvread.ErrStopped
		}
	}
	return err
}

// overBudget says whether the group first is over its budget.
func (c *Copy[R]) overBudget(first string) bool {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.overSet[first] != nil
}

// ReadNodeBound reads, into a mirror ReadNode returned, node's keys in the
// bucket of each provider its needs name, at most maxBound buckets, as
// ReadNode reads the state buckets but with no value (as the copy reads a
// provider's bucket) and bound on each request: a provider's bucket's key
// shape begins with <node> (registry.Validate), so its keys are <node>.>.
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
			revision, keys, err := readBound(ctx, js, bucket, node, m.Bound.maxKeys)
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

// readBound reads node's keys in a provider's bucket, and the bucket's
// revision as of the read; with maxKeys above zero, a bucket that holds
// more messages than maxKeys is not read (ErrNodeUnread): the copy may not
// hold it (Bound.SetMaxKeys).
func readBound(ctx context.Context, js jetstream.JetStream, bucket, node string, maxKeys int) (uint64, map[string]uint64, error) {
	apiCtx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	kv, err := js.KeyValue(apiCtx, bucket)
	if err != nil {
		return 0, nil, err
	}
	status, err := kv.Status(apiCtx)
	if err != nil {
		return 0, nil, err
	}
	state := status.(*jetstream.KeyValueBucketStatus).StreamInfo().State
	if maxKeys > 0 && state.Msgs > uint64(maxKeys) {
		return 0, nil, fmt.Errorf("%w: %s holds %d messages, more than the %d keys the copy holds of a provider's bucket", ErrNodeUnread, bucket, state.Msgs, maxKeys)
	}
	// The bucket's revision is the newer of its state's and the keys'
	// read after it, as the copy's, which holds no key newer than its
	// revision.
	keys, revision := map[string]uint64{}, state.LastSeq
	err = eachKey(ctx, kv, node, nil, []jetstream.WatchOpt{jetstream.MetaOnly()}, func(key string, _ []byte, rev uint64) bool {
		keys[key], revision = rev, max(revision, rev)
		return true
	})
	return revision, keys, err
}

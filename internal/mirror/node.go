package mirror

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/wire"
)

// ErrNodeUnread says ReadNode did not read a node: what it reads beside the
// node's keys is not loaded yet, or the node is over its budget. Its
// answers wait for the whole copy.
var ErrNodeUnread = errors.New("the node is not read alone")

// ReadNode reads one node's keys straight from its buckets, for an answer
// while the copy loads: it returns a mirror that holds the node's needs,
// applied records and items, each copy at the revision its bucket had when
// it was read, beside the copy's own registry and manifests, which must be
// loaded, and providers' buckets (the copy's: each is read once for every
// node, its lookups bounded, and a bucket named by a node's needs is waited
// for as the whole copy's answers wait for it). What it answers of the node
// is what the whole copy answers at those revisions, malformed keys
// included; a node over its budget in a bucket is not read.
//
// Each bucket is read by one batch direct get of the last value of each
// of the node's keys, which says the revision it read them at (direct.go
// says why). A node whose keys do not come in one (more than 1,024 of
// them, or a stream that answers no direct get) is read in two requests to
// the JetStream API: the bucket's state, which gives its revision (read
// first, so that the keys read are at least as new) and says whether a key
// is the node's name alone, then a KV watcher of the node's keys, stopped
// once they are in.
func (w *Watchers) ReadNode(ctx context.Context, node string) (*Mirror, error) {
	m := w.mirror
	if !m.Registry.Ready() || !m.Manifests.Ready() {
		return nil, fmt.Errorf("%w: the copy of the registry or of the manifests is still loading", ErrNodeUnread)
	}
	read := New()
	read.Registry, read.Manifests, read.manifests, read.Bound = m.Registry, m.Manifests, m.manifests, m.Bound
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
	apply := func(key string, value []byte, revision uint64, deleted bool) bool {
		into.Apply(key, value, revision, deleted)
		return !into.overBudget(node)
	}
	revision, err := readNodeDirect(ctx, f, node, budget.Bytes, apply)
	if errors.Is(err, errNotInOneBatch) {
		f.logger.Debug("a node's keys did not come in one direct get; reading them through a watcher", "node", node, "err", err)
		revision, err = readNodeWatched(ctx, f, node, func(key string, value []byte, revision uint64) bool {
			return apply(key, value, revision, false)
		})
	}
	if errors.Is(err, kvread.ErrStopped) {
		return fmt.Errorf("%w: the node is over its budget in %s (serve --node-max-keys, --node-max-bytes)", ErrNodeUnread, into.Bucket())
	}
	if err != nil {
		return fmt.Errorf("read %s of node %s: %w", into.Bucket(), node, err)
	}
	into.mu.Lock()
	into.advanceTo(revision)
	into.mu.Unlock()
	into.MarkLoaded()
	return nil
}

// readNodeDirect hands the last change of each key of node in f's bucket
// to each, in the order they were written, deletions too (so that the
// node's last change is the whole copy's), from one batch direct get
// (lastOfNode), until each returns false (kvread.ErrStopped), and returns
// the revision read at. It hands none unless the whole batch came: a node
// it does not read (errNotInOneBatch) is read again from its start,
// through a watcher.
func readNodeDirect(ctx context.Context, f *follower, node string, maxBytes int, each func(key string, value []byte, revision uint64, deleted bool) bool) (uint64, error) {
	apiCtx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	msgs, revision, err := f.lastOfNode(apiCtx, node, maxBytes)
	if err != nil {
		return 0, err
	}
	for _, msg := range msgs {
		key, _ := f.stored.Key(msg.Header.Get(jetstream.SubjectHeader))
		seq, err := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return 0, fmt.Errorf("direct get of %s without its revision: %w", key, err)
		}
		if !each(key, msg.Data, seq, wire.KVRemoves(msg.Header)) {
			return 0, kvread.ErrStopped
		}
	}
	return revision, nil
}

// readNodeWatched hands each live key of node in f's bucket to each, in
// the order they were written, through the bucket's state and a KV
// watcher, until each returns false (kvread.ErrStopped), and returns the
// revision read at.
func readNodeWatched(ctx context.Context, f *follower, node string, each func(key string, value []byte, revision uint64) bool) (uint64, error) {
	apiCtx, cancel := context.WithTimeout(ctx, apiTimeout)
	info, err := f.stream.Info(apiCtx, jetstream.WithSubjectFilter(f.prefix+node))
	cancel()
	if err != nil {
		return 0, err
	}
	// A key that is the node's name alone is malformed, and listed with
	// the node's: read when there is one.
	var alone []jetstream.KeyValueEntry
	if len(info.State.Subjects) > 0 {
		if alone, err = kvread.LiveOf(ctx, f.kv, node); err != nil {
			return 0, err
		}
	}
	if err := eachKey(ctx, f, node, alone, each); err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// eachKey hands each live key of node in f's bucket to each, in the order
// they were written, through a KV watcher of one filter, the stored
// <node>.> (kvread.LiveOf says why one), with the entries of alone (read
// apart) in their place, until each returns false (kvread.ErrStopped).
func eachKey(ctx context.Context, f *follower, node string, alone []jetstream.KeyValueEntry, each func(key string, value []byte, revision uint64) bool) error {
	take := func(e jetstream.KeyValueEntry) bool {
		return each(f.stored.KeyOfStored(e.Key()), e.Value(), e.Revision())
	}
	err := kvread.Each(ctx, f.kv, f.stored.NodeKeys(node), func(e jetstream.KeyValueEntry) bool {
		for len(alone) > 0 && alone[0].Revision() < e.Revision() {
			if !take(alone[0]) {
				return false
			}
			alone = alone[1:]
		}
		return take(e)
	})
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

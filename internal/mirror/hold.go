package mirror

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/backoff"
	"github.com/novox/mesh-provisioner/wire"
)

// Hold changes, while the copies are followed, which partitions' nodes the
// copies of needs, applied records and items hold (SetHolds set them
// first): the keys of the nodes of partitions no longer held are dropped at
// once, and every key of those held now, and not before, is read from its
// bucket. The channel returned is closed once each of the three copies
// holds those nodes whole: every change of theirs up to a revision of its
// bucket after the call. A Hold made while the last one's keys are still
// being read reads them too, and closes both channels when done.
//
// The keys are read by a consumer of their own beside the bucket's watcher,
// which goes on applying every change as it comes, those of the nodes held
// anew included; the read applies a key's last value unless the watcher
// applied a later change of it meanwhile. It reads the partitions taken on
// alone where the bucket stores keys by partition (wire.StoredKeys), and
// the bucket whole otherwise.
func (w *Watchers) Hold(held []bool) <-chan struct{} {
	was := w.mirror.heldNow()
	w.mirror.setHeld(held)
	var waits []<-chan struct{}
	for _, f := range w.followers {
		if w.mirror.isPartial(f.copy) {
			waits = append(waits, f.hold(w.filling, was, held))
		}
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for _, wait := range waits {
			<-wait
		}
	}()
	return done
}

// LetGo has the copies of needs, applied records and items hold the nodes
// of the partitions held, fewer than they hold: the keys of the others are
// dropped at once, and nothing is read again.
func (w *Watchers) LetGo(held []bool) {
	w.mirror.setHeld(held)
	for _, f := range w.followers {
		if w.mirror.isPartial(f.copy) {
			f.applying.Lock()
			f.copy.setHolds(holdsOf(held))
			f.copy.dropUnheld()
			f.applying.Unlock()
		}
	}
}

// isPartial reports whether c is a copy that may hold some nodes only.
func (m *Mirror) isPartial(c followed) bool {
	for _, p := range m.partial() {
		if p == c {
			return true
		}
	}
	return false
}

// fill is a read of the keys of the nodes a copy holds anew.
type fill struct {
	// partitions are those held anew, adding says whether a node is of
	// one.
	partitions []bool
	adding     func(first string) bool
	// seen is the revision of the last change of each key of those nodes
	// that the watcher applied while the read lasts: the read does not
	// apply an older value over it.
	seen   map[string]uint64
	cancel context.CancelFunc
	dones  []*closer // of this Hold and of those it took over
}

// saw records a change the watcher applies. f.applying is held; a nil fill
// records nothing.
func (fl *fill) saw(key string, revision uint64) {
	if fl == nil {
		return
	}
	if first, _, _ := strings.Cut(key, "."); fl.adding(first) {
		fl.seen[key] = max(fl.seen[key], revision)
	}
}

// closer closes its channel once.
type closer struct {
	once sync.Once
	ch   chan struct{}
}

func (c *closer) close() { c.once.Do(func() { close(c.ch) }) }

// hold has the follower's copy hold the partitions held, was before (nil
// for every node), and starts the read of the nodes it holds anew (a read
// under way is ended and taken over: its nodes are read again with these).
// It returns a channel closed once the read is done.
func (f *follower) hold(ctx context.Context, was, held []bool) <-chan struct{} {
	done := &closer{ch: make(chan struct{})}
	f.applying.Lock()
	defer f.applying.Unlock()
	fl := &fill{seen: map[string]uint64{}, dones: []*closer{done}, partitions: make([]bool, len(held))}
	prev := f.fill
	if prev != nil {
		prev.cancel()
		// Its nodes were not read whole: read them again, what the
		// watcher saw of them still standing.
		fl.seen, fl.dones = prev.seen, append(fl.dones, prev.dones...)
	}
	for p := range held {
		wasHeld := was == nil || (len(was) == len(held) && was[p])
		fl.partitions[p] = held[p] && (!wasHeld || prev != nil && len(prev.partitions) == len(held) && prev.partitions[p])
	}
	fl.adding = holdsOf(fl.partitions)
	f.copy.setHolds(holdsOf(held))
	f.copy.dropUnheld()
	var fctx context.Context
	fctx, fl.cancel = context.WithCancel(ctx)
	f.fill = fl
	go f.runFill(fctx, fl)
	return done.ch
}

// runFill reads the bucket's last values into the copy, those of fl's nodes
// alone, until the read is whole or ctx ends; a consumer lost is made
// again, and its read starts over.
func (f *follower) runFill(ctx context.Context, fl *fill) {
	retry := backoff.New(backoff.Config{Min: watchRetryMin, Max: watchRetryMax, Factor: 2, Jitter: 0.5})
	patience := newAPIPatience()
	for {
		err := f.readFill(ctx, fl, patience.Next())
		if err == nil {
			f.applying.Lock()
			if f.fill == fl {
				f.fill = nil
			}
			f.applying.Unlock()
			for _, done := range fl.dones {
				done.close()
			}
			return
		}
		if ctx.Err() != nil {
			return
		}
		f.logger.Warn("reading the keys of the nodes held anew failed; reading them again", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(retry.Next()):
		}
	}
}

// readFill is one consumer's read of every key's last value, applied to the
// copy for fl's nodes unless the watcher applied a later change of the key;
// its API requests are given up after timeout.
func (f *follower) readFill(ctx context.Context, fl *fill, timeout time.Duration) error {
	apiCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	// The read ends at the bucket's last revision now: each later change
	// is the watcher's, of nodes the copy holds already.
	info, err := f.stream.Info(apiCtx)
	if err != nil {
		return fmt.Errorf("read the bucket's stream state: %w", err)
	}
	last := info.State.LastSeq
	consumer, err := f.createConsumer(apiCtx, f.lastValues(fl.partitions))
	if err != nil {
		return fmt.Errorf("create the read's consumer: %w", err)
	}
	defer f.deleteConsumer(ctx, consumer)
	if consumer.CachedInfo().NumPending == 0 {
		return nil // an empty bucket
	}
	messages, err := consumer.Messages(jetstream.PullHeartbeat(readHeartbeat), jetstream.WithMessagesErrOnMissingHeartbeat(true),
		jetstream.PullMaxMessages(pullBatch))
	if err != nil {
		return fmt.Errorf("pull from the read's consumer: %w", err)
	}
	defer messages.Stop()
	stop := context.AfterFunc(ctx, messages.Stop)
	defer stop()
	var delivered uint64
	for {
		msg, err := messages.Next()
		if err != nil {
			return errors.Join(errors.New("the read's consumer was lost"), err, ctx.Err())
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		if meta.Sequence.Consumer != delivered+1 {
			return fmt.Errorf("%w: delivery %d after %d", ErrWatchGap, meta.Sequence.Consumer, delivered)
		}
		delivered = meta.Sequence.Consumer
		if key, ok := f.stored.Key(msg.Subject()); ok && !wire.KVRemoves(msg.Headers()) {
			f.applyFilled(fl, key, msg.Data(), meta.Sequence.Stream)
		}
		if meta.NumPending == 0 || meta.Sequence.Stream >= last {
			return nil
		}
	}
}

// deleteConsumer deletes a consumer of a read that is over, rather than
// leave it to its inactivity threshold.
func (f *follower) deleteConsumer(ctx context.Context, consumer jetstream.Consumer) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	defer cancel()
	_ = f.stream.DeleteConsumer(ctx, consumer.CachedInfo().Name)
}

// applyFilled applies a key's last value the read delivered, if it is of a
// node held anew and the watcher applied no later change of it.
func (f *follower) applyFilled(fl *fill, key string, value []byte, revision uint64) {
	first, _, _ := strings.Cut(key, ".")
	f.applying.Lock()
	defer f.applying.Unlock()
	if f.fill != fl || !fl.adding(first) || fl.seen[key] >= revision {
		return
	}
	f.copy.fillIn(key, value, revision)
}

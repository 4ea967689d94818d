package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrBucketMissing is returned by Open when a provisioning bucket does not
// exist; the buckets package creates them.
var ErrBucketMissing = errors.New("provisioning bucket missing")

// Watchers keep a mirror's copies up to date, one KV watcher per bucket.
type Watchers struct {
	mirror *Mirror
	kvs    []jetstream.KeyValue // in the order of Mirror.Copies
	logger *slog.Logger
}

// Open binds the four buckets; Run then watches them. A nil logger means
// slog.Default().
func (m *Mirror) Open(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (*Watchers, error) {
	if logger == nil {
		logger = slog.Default()
	}
	w := &Watchers{mirror: m, logger: logger}
	for _, c := range m.Copies() {
		kv, err := js.KeyValue(ctx, c.Bucket())
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrBucketMissing, c.Bucket())
		}
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", c.Bucket(), err)
		}
		w.kvs = append(w.kvs, kv)
	}
	return w, nil
}

// Run watches every bucket until ctx is done, starting a failed watcher
// again after a pause; it returns once every watcher has stopped.
func (w *Watchers) Run(ctx context.Context) {
	var wg sync.WaitGroup
	for i, c := range w.mirror.Copies() {
		wg.Go(func() { w.keepWatching(ctx, c, w.kvs[i]) })
	}
	wg.Wait()
}

// How long keepWatching pauses before it starts a failed watcher again.
const (
	watchRetryMin = 250 * time.Millisecond
	watchRetryMax = 30 * time.Second
)

// keepWatching runs a bucket's watcher until ctx is done, starting it again,
// after a pause that grows to watchRetryMax, whenever it fails.
func (w *Watchers) keepWatching(ctx context.Context, c Watched, kv jetstream.KeyValue) {
	pause := watchRetryMin
	for {
		started := time.Now()
		err := watch(ctx, c, kv)
		if ctx.Err() != nil {
			return
		}
		c.setBehind(true)
		if time.Since(started) > watchRetryMax {
			pause = watchRetryMin // it had been running well: not a failure streak
		}
		w.logger.Error("bucket watcher failed; starting it again", "bucket", c.Bucket(), "err", err, "in", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, watchRetryMax)
	}
}

// watch keeps a copy up to date until ctx is done or the watcher stops. It
// may be called again after it returns: the keys a new watcher does not
// deliver among its initial values are dropped from the copy then.
func watch(ctx context.Context, c Watched, kv jetstream.KeyValue) error {
	watcher, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", c.Bucket(), err)
	}
	defer func() { _ = watcher.Stop() }()
	initial := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watcher.Updates():
			if !ok {
				return fmt.Errorf("watcher of bucket %s stopped", c.Bucket())
			}
			if e == nil {
				c.keepOnly(initial)
				initial = nil
				c.MarkLoaded()
				c.setBehind(false)
				continue
			}
			if initial != nil {
				initial[e.Key()] = true
			}
			c.Apply(e.Key(), e.Value(), e.Revision(), e.Operation() != jetstream.KeyValuePut)
		}
	}
}

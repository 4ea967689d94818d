// Package kvread reads a KV bucket's live keys once, through one watcher,
// rather than one Get per key.
package kvread

import (
	"context"
	"errors"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrWatcherStopped is returned when the watcher stops before it has
// delivered the bucket's initial values.
var ErrWatcherStopped = errors.New("watcher stopped before the initial values were in")

// Live returns every live entry of kv (deleted keys left out; opts such as
// jetstream.MetaOnly narrow what is read), in the order
// the watcher delivers them.
func Live(ctx context.Context, kv jetstream.KeyValue, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	return LiveOf(ctx, kv, ">", opts...)
}

// LiveOf is Live for the keys that match filter (a KV key pattern) only.
// It takes one filter: nats-server makes a watcher of several filters
// count what it has pending across the whole stream (on 3 million keys,
// 517 ms to read 300 keys through [k, k.>] against 5 ms through k.>).
func LiveOf(ctx context.Context, kv jetstream.KeyValue, filter string, opts ...jetstream.WatchOpt) ([]jetstream.KeyValueEntry, error) {
	w, err := kv.Watch(ctx, filter, append([]jetstream.WatchOpt{jetstream.IgnoreDeletes()}, opts...)...)
	if err != nil {
		return nil, err
	}
	defer func() { _ = w.Stop() }()
	var entries []jetstream.KeyValueEntry
	for {
		select {
		case <-ctx.Done():
			return nil, ctx.Err()
		case e, ok := <-w.Updates():
			if !ok {
				return nil, ErrWatcherStopped
			}
			if e == nil {
				return entries, nil
			}
			entries = append(entries, e)
		}
	}
}

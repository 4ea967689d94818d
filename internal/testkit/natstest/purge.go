package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Purge empties a stream as an operator can: a stream that refuses purges
// (the state buckets: buckets.Ensure sets DenyPurge, which nats-server
// never lets an update turn off) is deleted and made again with the same
// configuration, which loses every message as a purge would; any other is
// purged, by subject with opts.
func Purge(ctx context.Context, t testing.TB, js jetstream.JetStream, stream string, opts ...jetstream.StreamPurgeOpt) {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	if !cfg.DenyPurge {
		if err := s.Purge(ctx, opts...); err != nil {
			t.Fatalf("purge %s: %v", stream, err)
		}
		return
	}
	if len(opts) > 0 {
		t.Fatalf("%s refuses purges: a purge by subject cannot be done to it", stream)
	}
	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Fatalf("delete %s: %v", stream, err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatalf("make %s again: %v", stream, err)
	}
}

// MakePurgeable deletes a stream and makes it again, empty, with purges
// allowed: for tests of how a purge is noticed, on a bucket made by
// buckets.Ensure.
func MakePurgeable(ctx context.Context, t testing.TB, js jetstream.JetStream, stream string) {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	cfg := s.CachedInfo().Config
	cfg.DenyPurge = false
	if err := js.DeleteStream(ctx, stream); err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctx, cfg); err != nil {
		t.Fatal(err)
	}
}

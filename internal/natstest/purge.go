package natstest

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
)

// Purge purges a stream as an operator who means it does: the state
// buckets refuse purges (buckets.Ensure sets DenyPurge), so it first turns
// that off, as `nats stream edit --allow-purge` would.
func Purge(ctx context.Context, t testing.TB, js jetstream.JetStream, stream string, opts ...jetstream.StreamPurgeOpt) {
	t.Helper()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if cfg := s.CachedInfo().Config; cfg.DenyPurge {
		cfg.DenyPurge = false
		if _, err := js.UpdateStream(ctx, cfg); err != nil {
			t.Fatalf("allow purges on %s: %v", stream, err)
		}
	}
	if err := s.Purge(ctx, opts...); err != nil {
		t.Fatalf("purge %s: %v", stream, err)
	}
}

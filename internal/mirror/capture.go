package mirror

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Capture reads every live key of the five provisioning buckets, with its
// value and revision, and of the providers' buckets the captured needs name
// the key and revision alone, as the server's copy holds them: through one
// watcher per bucket. A provider's bucket that does not exist is left out.
func Capture(ctx context.Context, js jetstream.JetStream) (*provisionerv1.Capture, error) {
	out := &provisionerv1.Capture{CapturedAt: timestamppb.Now()}
	for _, bucket := range keys.Buckets() {
		captured, err := captureBucket(ctx, js, bucket)
		if err != nil {
			return nil, err
		}
		out.Buckets = append(out.Buckets, captured)
	}
	loaded, err := Load(out)
	if err != nil {
		return nil, err
	}
	for _, bucket := range loaded.BoundBuckets() {
		captured, err := captureBucket(ctx, js, bucket, jetstream.MetaOnly())
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out.Buckets = append(out.Buckets, captured)
	}
	return out, nil
}

// captureBucket reads one bucket's live keys, in key order, each named by
// its key, not as it is stored (wire.StoredKeys).
func captureBucket(ctx context.Context, js jetstream.JetStream, bucket string, opts ...jetstream.WatchOpt) (*provisionerv1.CapturedBucket, error) {
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", bucket, err)
	}
	stream, err := js.Stream(ctx, wire.StreamOf(bucket))
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", bucket, err)
	}
	stored, err := wire.StoredKeysOf(bucket, stream.CachedInfo().Config.SubjectTransform)
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", bucket, err)
	}
	live, err := kvread.Live(ctx, kv, opts...)
	if err != nil {
		return nil, fmt.Errorf("capture %s: %w", bucket, err)
	}
	captured := &provisionerv1.CapturedBucket{Bucket: bucket}
	for _, e := range live {
		captured.Entries = append(captured.Entries, &provisionerv1.CapturedEntry{Key: stored.KeyOfStored(e.Key()), Value: e.Value(), Revision: e.Revision()})
		captured.Revision = max(captured.GetRevision(), e.Revision())
	}
	slices.SortFunc(captured.GetEntries(), func(a, b *provisionerv1.CapturedEntry) int { return strings.Compare(a.GetKey(), b.GetKey()) })
	return captured, nil
}

// BoundBuckets returns the providers' buckets that the needs of the copy
// name through the registry's entries that each provider answers, sorted.
func (m *Mirror) BoundBuckets() []string {
	needs, _ := m.Needs.All()
	var buckets []string
	seen := map[string]bool{}
	for _, e := range needs {
		provider := e.Record.GetNeed().GetProvider()
		if e.Malformed != nil || provider == "" || seen[e.Record.GetKind()+"."+provider] {
			continue
		}
		seen[e.Record.GetKind()+"."+provider] = true
		if bucket, ok := m.BoundBucketOf(e.Record.GetKind(), provider); ok && !slices.Contains(buckets, bucket) {
			buckets = append(buckets, bucket)
		}
	}
	slices.Sort(buckets)
	return buckets
}

// Load returns a loaded mirror that holds a capture. A bucket the capture
// lacks is empty; so is a provider's bucket, which is not followed.
func Load(capture *provisionerv1.Capture) (*Mirror, error) {
	m := New()
	m.Bound.held = true
	copies := map[string]followed{}
	for _, c := range m.followedCopies() {
		copies[c.Bucket()] = c
	}
	for _, b := range capture.GetBuckets() {
		c, ok := copies[b.GetBucket()]
		if !ok && strings.HasSuffix(b.GetBucket(), wire.BoundSuffix) {
			bound := map[string]uint64{}
			for _, e := range b.GetEntries() {
				bound[e.GetKey()] = e.GetRevision()
			}
			m.Bound.Bucket(b.GetBucket()).replace(bound, b.GetRevision())
			continue
		}
		if !ok {
			return nil, fmt.Errorf("the capture holds bucket %q, which is neither a provisioning bucket nor a provider's", b.GetBucket())
		}
		for _, e := range b.GetEntries() {
			c.Apply(e.GetKey(), e.GetValue(), e.GetRevision(), false)
		}
	}
	for _, c := range m.followedCopies() {
		c.MarkLoaded()
	}
	return m, nil
}

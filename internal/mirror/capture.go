package mirror

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/keys"
)

// Capture reads every live key of the four provisioning buckets, with its
// value and revision, through one watcher per bucket.
func Capture(ctx context.Context, js jetstream.JetStream) (*provisionerv1.Capture, error) {
	out := &provisionerv1.Capture{CapturedAt: timestamppb.Now()}
	for _, bucket := range keys.Buckets() {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return nil, fmt.Errorf("capture %s: %w", bucket, err)
		}
		live, err := kvread.Live(ctx, kv)
		if err != nil {
			return nil, fmt.Errorf("capture %s: %w", bucket, err)
		}
		captured := &provisionerv1.CapturedBucket{Bucket: bucket}
		for _, e := range live {
			captured.Entries = append(captured.Entries, &provisionerv1.CapturedEntry{Key: e.Key(), Value: e.Value(), Revision: e.Revision()})
			captured.Revision = max(captured.GetRevision(), e.Revision())
		}
		slices.SortFunc(captured.GetEntries(), func(a, b *provisionerv1.CapturedEntry) int { return strings.Compare(a.GetKey(), b.GetKey()) })
		out.Buckets = append(out.Buckets, captured)
	}
	return out, nil
}

// Load returns a loaded mirror that holds a capture. A bucket the capture
// lacks is empty.
func Load(capture *provisionerv1.Capture) (*Mirror, error) {
	m := New()
	copies := map[string]Watched{}
	for _, c := range m.Copies() {
		copies[c.Bucket()] = c
	}
	for _, b := range capture.GetBuckets() {
		c, ok := copies[b.GetBucket()]
		if !ok {
			return nil, fmt.Errorf("the capture holds bucket %q, which is not a provisioning bucket", b.GetBucket())
		}
		for _, e := range b.GetEntries() {
			c.Apply(e.GetKey(), e.GetValue(), e.GetRevision(), false)
		}
	}
	for _, c := range m.Copies() {
		c.MarkLoaded()
	}
	return m, nil
}

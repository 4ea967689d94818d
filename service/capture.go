package service

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
			captured.Revision = max(captured.Revision, e.Revision())
		}
		slices.SortFunc(captured.Entries, func(a, b *provisionerv1.CapturedEntry) int { return strings.Compare(a.GetKey(), b.GetKey()) })
		out.Buckets = append(out.Buckets, captured)
	}
	return out, nil
}

// Replay is a copy of the provisioning buckets loaded from a capture: it
// answers the verbs as the live service would at the captured revisions,
// without NATS. For tests, benchmarks and looking into a captured mesh.
type Replay struct {
	mirror *mirror
}

// NewReplay loads a capture. A bucket the capture lacks is empty.
func NewReplay(capture *provisionerv1.Capture) (*Replay, error) {
	m := newMirror()
	copies := map[string]interface {
		apply(key string, value []byte, revision uint64, deleted bool)
		markLoaded()
	}{
		keys.RegistryBucket: m.registry, keys.NeedsBucket: m.needs, keys.AppliedBucket: m.applied, keys.CollectBucket: m.collect,
	}
	for _, b := range capture.GetBuckets() {
		c, ok := copies[b.GetBucket()]
		if !ok {
			return nil, fmt.Errorf("replay: the capture holds bucket %q, which is not a provisioning bucket", b.GetBucket())
		}
		for _, e := range b.GetEntries() {
			c.apply(e.GetKey(), e.GetValue(), e.GetRevision(), false)
		}
	}
	for _, c := range copies {
		c.markLoaded()
	}
	return &Replay{mirror: m}, nil
}

// Compose composes a node as the compose verb would; it does not check the
// request, nor wait for revisions.
func (r *Replay) Compose(in *provisionerv1.ComposeRequest) *provisionerv1.ComposeResponse {
	out, _ := r.mirror.compose(in, 0, true)
	return out
}

// Provisioning answers as the provisioning verb would; it does not check the
// request, nor wait for revisions.
func (r *Replay) Provisioning(in *provisionerv1.ProvisioningRequest) *provisionerv1.ProvisioningResponse {
	return provisioningFrom(r.mirror, in)
}

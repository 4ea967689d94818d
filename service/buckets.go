package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/keys"
)

// EnsureBuckets creates each provisioning bucket that is missing, with the
// given number of replicas (1 on a single server, 3 on a cluster), and makes
// sure no state bucket allows rollups. A bucket that exists keeps the rest of
// its configuration.
//
// Rollups are refused because permissions cannot stop them: a node allowed to
// publish to its own key could send the header Nats-Rollup: all and purge
// every node's keys. Without rollups a node deletes its keys with delete
// markers, and a KV purge of a key is refused.
func EnsureBuckets(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if replicas < 1 {
		replicas = 1
	}
	for _, bucket := range keys.Buckets() {
		_, err := js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket:      bucket,
				Description: "mesh-provisioner: " + bucketDescriptions[bucket],
				Replicas:    replicas,
			})
			if errors.Is(err, jetstream.ErrBucketExists) {
				err = nil // created by another instance meanwhile
			}
		}
		if err != nil {
			return fmt.Errorf("bucket %s: %w", bucket, err)
		}
	}
	for _, bucket := range keys.StateBuckets() {
		if err := refuseRollups(ctx, js, bucket); err != nil {
			return err
		}
	}
	return nil
}

// refuseRollups turns off AllowRollup on a bucket's stream, which the KV
// client turns on when it creates a bucket.
func refuseRollups(ctx context.Context, js jetstream.JetStream, bucket string) error {
	stream, err := js.Stream(ctx, StreamOf(bucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	cfg := stream.CachedInfo().Config
	if !cfg.AllowRollup {
		return nil
	}
	cfg.AllowRollup = false
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return fmt.Errorf("bucket %s: turn off rollups: %w", bucket, err)
	}
	return nil
}

// StreamOf returns the name of the JetStream stream that holds a KV bucket.
func StreamOf(bucket string) string { return "KV_" + bucket }

var bucketDescriptions = map[string]string{
	keys.RegistryBucket: "which module answers each kind of placeholder, keyed <kind>",
	keys.NeedsBucket:    "what each module needs, keyed <node>.<module>.<kind>.<name>",
	keys.AppliedBucket:  "what is applied, keyed <node>.<module>",
	keys.CollectBucket:  "collection items, keyed <node>.<collection>.<contributor>",
}

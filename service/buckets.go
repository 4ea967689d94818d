package service

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/keys"
)

// EnsureBuckets creates each provisioning bucket that is missing, with the
// given number of replicas (1 on a single server, 3 on a cluster). A bucket
// that exists is left as it is.
func EnsureBuckets(ctx context.Context, js jetstream.JetStream, replicas int) error {
	if replicas < 1 {
		replicas = 1
	}
	for _, bucket := range keys.Buckets() {
		_, err := js.KeyValue(ctx, bucket)
		if err == nil {
			continue
		}
		if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("look up bucket %s: %w", bucket, err)
		}
		_, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket:      bucket,
			Description: "mesh-provisioner: " + bucketDescriptions[bucket],
			Replicas:    replicas,
		})
		if err != nil && !errors.Is(err, jetstream.ErrBucketExists) {
			return fmt.Errorf("create bucket %s: %w", bucket, err)
		}
	}
	return nil
}

var bucketDescriptions = map[string]string{
	keys.RegistryBucket: "which module answers each kind of placeholder, keyed <kind>",
	keys.NeedsBucket:    "what each module needs, keyed <node>.<module>.<kind>.<name>",
	keys.AppliedBucket:  "what is applied, keyed <node>.<module>",
	keys.CollectBucket:  "collection items, keyed <node>.<collection>.<contributor>",
}

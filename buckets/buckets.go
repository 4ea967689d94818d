package buckets

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Config says how the buckets are made.
type Config struct {
	// Replicas of each bucket created: 1 on a single server, 3 on a cluster.
	// Zero means 1. A bucket that exists keeps its replicas.
	Replicas int
	// MaxValueSize is the largest value a state bucket takes, in bytes;
	// nats-server refuses a larger put from any writer. Zero means
	// DefaultMaxValueSize.
	MaxValueSize int32
	// MaxBytes is the most a state bucket holds, in bytes; a put that would
	// grow it further is refused. Zero means DefaultMaxBytes.
	MaxBytes int64
	// MaxPlanWatchers is how many consumers the plans bucket's stream takes:
	// the seat holder's watch of the bucket (one a tenure, each gone after
	// its inactivity threshold) and operators' reads of it (capture).
	// Nodes make none: a node hears its key's writes on the key's subject
	// and reads the key with a direct get (docs/security.md). Zero means
	// DefaultMaxPlanWatchers.
	MaxPlanWatchers int
	// Partitions, when not zero, has the buckets of needs, applied records
	// and items made from now on store each key under its node's partition
	// of this many (wire.StoredKeys), so that an instance serving some
	// partitions reads their keys alone: serve's --partitions. A bucket
	// written already keeps the layout it has. The manifests, which every
	// instance holds whole, are stored as written.
	Partitions int
}

// Defaults of Config. A need, an applied record or a collection item is a
// few hundred bytes: 64 KiB leaves room for a large collection item, and
// 1 GiB for millions of keys.
const (
	DefaultMaxValueSize = 64 << 10
	DefaultMaxBytes     = 1 << 30
	// DefaultMaxPlanWatchers is nats-server's own cap of a stream that
	// sets none (JSDefaultMaxConsumersPerStream, 1,000), rounded up: room
	// for many tenures and operators at once, and no more.
	DefaultMaxPlanWatchers = 1_024
)

// Ensure creates each provisioning bucket that is missing, makes sure
// every state bucket refuses rollups and purges and has the size limits of cfg, and
// that the registry's stream keeps the provisioner seat (configureRegistry),
// updating buckets that already exist. It leaves the rest of an existing
// bucket's configuration alone.
//
// Rollups are refused because permissions cannot stop them: a node allowed to
// publish to its own key could send the header Nats-Rollup: all and purge
// every node's keys. Without rollups a node deletes its keys with delete
// markers, and a KV purge of a key is refused.
func Ensure(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	cfg.Replicas = max(cfg.Replicas, 1)
	if cfg.MaxValueSize <= 0 {
		cfg.MaxValueSize = DefaultMaxValueSize
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = DefaultMaxBytes
	}
	if cfg.MaxPlanWatchers <= 0 {
		cfg.MaxPlanWatchers = DefaultMaxPlanWatchers
	}
	for _, bucket := range append(keys.Buckets(), keys.PlansBucket) {
		_, err := js.KeyValue(ctx, bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			kv := jetstream.KeyValueConfig{
				Bucket:      bucket,
				Description: "mesh-provisioner: " + descriptions[bucket],
				Replicas:    cfg.Replicas,
			}
			if bucket != keys.RegistryBucket {
				kv.MaxValueSize, kv.MaxBytes = cfg.MaxValueSize, cfg.MaxBytes
			}
			_, err = js.CreateKeyValue(ctx, kv)
			if errors.Is(err, jetstream.ErrBucketExists) {
				err = nil // created by another instance meanwhile
			}
		}
		if err != nil {
			return fmt.Errorf("bucket %s: %w", bucket, err)
		}
	}
	for _, bucket := range keys.StateBuckets() {
		if err := configureState(ctx, js, bucket, cfg); err != nil {
			return err
		}
	}
	if err := configurePlans(ctx, js, cfg); err != nil {
		return err
	}
	return configureRegistry(ctx, js)
}

// configurePlans sets how many consumers the plans bucket's stream takes
// (Config.MaxPlanWatchers), on a stream made before too, which an earlier
// version let take one a node.
func configurePlans(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	stream, err := js.Stream(ctx, wire.StreamOf(keys.PlansBucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", keys.PlansBucket, err)
	}
	sc := stream.CachedInfo().Config
	if sc.MaxConsumers == cfg.MaxPlanWatchers {
		return nil
	}
	sc.MaxConsumers = cfg.MaxPlanWatchers
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("bucket %s: take %d watchers: %w", keys.PlansBucket, cfg.MaxPlanWatchers, err)
	}
	return nil
}

// configureRegistry makes the registry bucket's stream hold the provisioner
// seat as well (package seat), and the partitions' seats: it adds
// wire.SeatSubject and wire.PartitionSeatSubjects to the stream's subjects, outside the bucket's keys so that no KV watcher sees it, and
// allows per-message TTLs, which the seat's lease carries. The seat lives in
// the registry's stream so that each registry write can be made conditional
// on the lease in one publish.
func configureRegistry(ctx context.Context, js jetstream.JetStream) error {
	stream, err := js.Stream(ctx, wire.StreamOf(keys.RegistryBucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", keys.RegistryBucket, err)
	}
	sc := stream.CachedInfo().Config
	if sc.AllowMsgTTL && slices.Contains(sc.Subjects, wire.SeatSubject) && slices.Contains(sc.Subjects, wire.PartitionSeatSubjects) {
		return nil
	}
	sc.AllowMsgTTL = true
	for _, subject := range []string{wire.SeatSubject, wire.PartitionSeatSubjects} {
		if !slices.Contains(sc.Subjects, subject) {
			sc.Subjects = append(sc.Subjects, subject)
		}
	}
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("bucket %s: keep the provisioner seat: %w", keys.RegistryBucket, err)
	}
	return nil
}

// configureState turns off AllowRollup on a state bucket's stream, which the
// KV client turns on when it creates a bucket, turns on DenyPurge, sets its
// size limits, and, on a stream never written, stores its keys by partition
// (Config.Partitions).
//
// DenyPurge: nothing a bucket needs purges its stream (a node deletes its
// keys with delete markers; KV's own purge of a key is a rollup, refused
// already), so a purge, of the whole stream or by subject, can only be an
// accident or an attack, through the JetStream API or any identity lent to
// one. An operator who means it edits the stream first (docs/security.md);
// the next start sets DenyPurge again.
func configureState(ctx context.Context, js jetstream.JetStream, bucket string, cfg Config) error {
	stream, err := js.Stream(ctx, wire.StreamOf(bucket))
	if err != nil {
		return fmt.Errorf("bucket %s: %w", bucket, err)
	}
	info := stream.CachedInfo()
	sc := info.Config
	// The keys' layout is set on a stream never written only, which holds
	// no key of another layout: instances starting together set the same.
	layout := sc.SubjectTransform
	if layout == nil && info.State.LastSeq == 0 && cfg.Partitions > 0 && bucket != keys.ManifestsBucket {
		layout = wire.StoredKeys{Bucket: bucket, Partitions: cfg.Partitions}.Transform()
	}
	if !sc.AllowRollup && sc.DenyPurge && sc.MaxMsgSize == cfg.MaxValueSize && sc.MaxBytes == cfg.MaxBytes && layout == sc.SubjectTransform {
		return nil
	}
	sc.SubjectTransform = layout
	sc.AllowRollup, sc.DenyPurge = false, true
	sc.MaxMsgSize, sc.MaxBytes = cfg.MaxValueSize, cfg.MaxBytes
	if _, err := js.UpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("bucket %s: refuse rollups and purges and set its limits: %w", bucket, err)
	}
	return nil
}

var descriptions = map[string]string{
	keys.PlansBucket:    "each node's plan digest, keyed <node>, written by the seat's holder",
	keys.RegistryBucket: "which module answers each kind of placeholder, keyed <kind>",
	keys.NeedsBucket:    "what each module needs, keyed <node>.<module>.<kind>.<name>",
	keys.AppliedBucket:  "what is applied, keyed <node>.<module>",
	keys.CollectBucket:  "collection items, keyed <node>.<collection>.<contributor>",
}

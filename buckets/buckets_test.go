package buckets_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

func TestEnsureRefusesRollups(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	// A state bucket made before, by the KV client, allows rollups.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: keys.NeedsBucket}); err != nil {
		t.Fatal(err)
	}
	for range 2 { // a second run changes nothing and fails on nothing
		if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, bucket := range keys.Buckets() {
		stream, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			t.Fatalf("bucket %s: %v", bucket, err)
		}
		state := bucket != keys.RegistryBucket
		if got := stream.CachedInfo().Config.AllowRollup; got == state {
			t.Errorf("bucket %s: AllowRollup = %v", bucket, got)
		}
	}

	needs, _ := js.KeyValue(ctx, keys.NeedsBucket)
	for _, key := range []string{"ace.web.port.http", "novox.web.port.http"} {
		if _, err := needs.Put(ctx, key, nil); err != nil {
			t.Fatal(err)
		}
	}
	// A rollup of the whole stream, sent on a node's own key, is refused.
	msg := nats.NewMsg(wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"))
	msg.Header.Set("Nats-Rollup", "all")
	if _, err := js.PublishMsg(ctx, msg); err == nil {
		t.Error("a Nats-Rollup: all publish was accepted")
	}
	if _, err := needs.Get(ctx, "novox.web.port.http"); err != nil {
		t.Errorf("novox's need after the rollup attempt: %v", err)
	}
}

// The size limits are nats-server's to enforce, on every writer: a put over
// the value size is refused, and an existing bucket takes the limits too.
func TestEnsureSetsSizeLimits(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	// A state bucket made before without limits.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: keys.CollectBucket}); err != nil {
		t.Fatal(err)
	}
	cfg := buckets.Config{MaxValueSize: 1024, MaxBytes: 1 << 20}
	if err := buckets.Ensure(ctx, js, cfg); err != nil {
		t.Fatal(err)
	}
	for _, bucket := range keys.StateBuckets() {
		stream, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			t.Fatal(err)
		}
		if c := stream.CachedInfo().Config; c.MaxMsgSize != 1024 || c.MaxBytes != 1<<20 {
			t.Errorf("bucket %s: max value size %d, max bytes %d; want 1024 and %d", bucket, c.MaxMsgSize, c.MaxBytes, 1<<20)
		}
	}
	needs, _ := js.KeyValue(ctx, keys.NeedsBucket)
	if _, err := needs.Put(ctx, "ace.web.port.http", make([]byte, 1000)); err != nil {
		t.Errorf("a put under the value size: %v", err)
	}
	if _, err := needs.Put(ctx, "ace.web.port.big", make([]byte, 2000)); err == nil {
		t.Error("a put over the value size was accepted")
	}
	if _, err := needs.Get(ctx, "ace.web.port.big"); err == nil {
		t.Error("the refused put is in the bucket")
	}
}

func TestEnsureKeepsTheSeatInTheRegistryStream(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	// A registry bucket made before the seat existed.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: keys.RegistryBucket}); err != nil {
		t.Fatal(err)
	}
	for range 2 {
		if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
			t.Fatal(err)
		}
	}
	stream, err := js.Stream(ctx, wire.StreamOf(keys.RegistryBucket))
	if err != nil {
		t.Fatal(err)
	}
	sc := stream.CachedInfo().Config
	if !sc.AllowMsgTTL || !slices.Contains(sc.Subjects, wire.SeatSubject) || !slices.Contains(sc.Subjects, wire.PartitionSeatSubjects) {
		t.Errorf("registry stream: AllowMsgTTL %v, subjects %v; want TTLs, %s and %s", sc.AllowMsgTTL, sc.Subjects, wire.SeatSubject, wire.PartitionSeatSubjects)
	}
	// The seat's message is not a key of the bucket: its watchers never see it.
	if _, err := js.Publish(ctx, wire.SeatSubject, []byte(`{"holder":"x"}`), jetstream.WithMsgTTL(time.Second)); err != nil {
		t.Fatal(err)
	}
	registryKV, _ := js.KeyValue(ctx, keys.RegistryBucket)
	if _, err := registryKV.Put(ctx, "port", []byte("entry")); err != nil {
		t.Fatal(err)
	}
	lister, err := registryKV.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for k := range lister.Keys() {
		got = append(got, k)
	}
	if !slices.Equal(got, []string{"port"}) {
		t.Errorf("registry keys %v, want [port]", got)
	}
}

// A state bucket refuses a purge of its stream, whole or by subject, from
// any identity, the unrestricted one here; what the buckets do still works:
// puts, delete markers, watches, gets by key. A bucket made before takes
// DenyPurge too.
func TestEnsureRefusesPurges(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: keys.AppliedBucket}); err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	for _, bucket := range keys.Buckets() {
		stream, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			t.Fatal(err)
		}
		state := bucket != keys.RegistryBucket
		if got := stream.CachedInfo().Config.DenyPurge; got != state {
			t.Errorf("bucket %s: DenyPurge = %v, want %v", bucket, got, state)
		}
	}

	needs, _ := js.KeyValue(ctx, keys.NeedsBucket)
	for _, key := range []string{"ace.web.port.http", "novox.web.port.http"} {
		if _, err := needs.Put(ctx, key, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	if err := needs.Delete(ctx, "ace.web.port.http"); err != nil {
		t.Fatalf("a delete marker: %v", err)
	}
	stream, _ := js.Stream(ctx, wire.StreamOf(keys.NeedsBucket))
	for _, opts := range [][]jetstream.StreamPurgeOpt{nil, {jetstream.WithPurgeSubject(wire.KVSubject(keys.NeedsBucket, "novox.>"))}} {
		if err := stream.Purge(ctx, opts...); err == nil || !strings.Contains(err.Error(), "purge not permitted") {
			t.Errorf("purge %v: %v, want it refused", opts, err)
		}
	}
	if err := needs.PurgeDeletes(ctx); err == nil {
		t.Error("PurgeDeletes, which purges the stream, was accepted")
	}
	if e, err := needs.Get(ctx, "novox.web.port.http"); err != nil || string(e.Value()) != "v" {
		t.Errorf("novox's need after the purges: %v", err)
	}
	// A watcher reads what the purges left: each key's last write, the
	// delete marker included (read up to the end of its initial values, not
	// waiting on live ones).
	watcher, err := needs.WatchAll(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = watcher.Stop() }()
	var seen []string
read:
	for {
		select {
		case e := <-watcher.Updates():
			if e == nil {
				break read
			}
			seen = append(seen, e.Key()+"="+e.Operation().String())
		case <-time.After(10 * time.Second):
			t.Fatalf("the watcher read %v and no more in 10s", seen)
		}
	}
	if want := []string{"novox.web.port.http=KeyValuePutOp", "ace.web.port.http=KeyValueDeleteOp"}; !slices.Equal(seen, want) {
		t.Errorf("watched %v, want %v", seen, want)
	}
}

// The plans bucket takes a watcher a node: its stream's own limit, which
// nats-server applies instead of its default of 1,000 consumers a stream
// (make bench-plans watches with 1,000 nodes and the writer).
func TestEnsureLetsTheNodesWatchTheirPlans(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	stream, err := js.Stream(ctx, wire.StreamOf(keys.PlansBucket))
	if err != nil {
		t.Fatal(err)
	}
	if got := stream.CachedInfo().Config.MaxConsumers; got != buckets.DefaultMaxPlanWatchers {
		t.Errorf("the plans stream takes %d consumers, want %d", got, buckets.DefaultMaxPlanWatchers)
	}
	// The limit is the stream's, and Ensure sets it on a stream that exists.
	if err := buckets.Ensure(ctx, js, buckets.Config{MaxPlanWatchers: 3}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		node := fmt.Sprintf("node-%d", i)
		_, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{FilterSubject: wire.KVSubject(keys.PlansBucket, node), InactiveThreshold: time.Minute})
		if i < 3 && err != nil {
			t.Fatalf("the watcher of %s: %v", node, err)
		}
		if i == 3 && !errors.Is(err, jetstream.ErrMaximumConsumersLimit) {
			t.Errorf("a fourth watcher with room for three: %v", err)
		}
	}
}

// With Partitions, the buckets of needs, applied records and items store
// each key under its node's partition, as the verbs' mapping computes it,
// while a KV put, create, update at a revision and delete keep their
// meaning on the key written; a bucket written before keeps its layout,
// and the manifests are stored as written.
func TestEnsureStoresKeysByPartition(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	// The collect bucket made and written before, by an earlier version.
	collect, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: keys.CollectBucket})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := collect.Put(ctx, "ace.motd.web", nil); err != nil {
		t.Fatal(err)
	}
	const partitions = 8
	for range 2 { // a second run changes nothing and fails on nothing
		if err := buckets.Ensure(ctx, js, buckets.Config{Partitions: partitions}); err != nil {
			t.Fatal(err)
		}
	}
	for bucket, want := range map[string]int{keys.NeedsBucket: partitions, keys.AppliedBucket: partitions, keys.CollectBucket: 0, keys.ManifestsBucket: 0} {
		stream, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			t.Fatal(err)
		}
		stored, err := wire.StoredKeysOf(bucket, stream.CachedInfo().Config.SubjectTransform)
		if err != nil || stored.Partitions != want {
			t.Errorf("bucket %s stores keys by %d partitions (%v), want %d", bucket, stored.Partitions, err, want)
		}
	}

	needs, _ := js.KeyValue(ctx, keys.NeedsBucket)
	stream, _ := js.Stream(ctx, wire.StreamOf(keys.NeedsBucket))
	stored := wire.StoredKeys{Bucket: keys.NeedsBucket, Partitions: partitions}
	const key = "ace.web.port.http"
	first, err := needs.Create(ctx, key, []byte("v1"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := needs.Create(ctx, key, []byte("again")); err == nil {
		t.Error("a second create of the key was taken")
	}
	if _, err := needs.Update(ctx, key, []byte("stale"), first+7); err == nil {
		t.Error("an update at a revision the key is not at was taken")
	}
	second, err := needs.Update(ctx, key, []byte("v2"), first)
	if err != nil {
		t.Fatalf("the update at the key's revision: %v", err)
	}
	msg, err := stream.GetLastMsgForSubject(ctx, stored.NodePrefix("ace")+"web.port.http")
	if err != nil {
		t.Fatalf("the key at its stored subject: %v", err)
	}
	if got, ok := stored.Key(msg.Subject); !ok || got != key || string(msg.Data) != "v2" || msg.Sequence != second {
		t.Errorf("stored %s = %q at %d, want %s = v2 at %d", got, msg.Data, msg.Sequence, key, second)
	}
	if want := wire.KVSubject(keys.NeedsBucket, fmt.Sprintf("%d.ace.web.port.http", wire.PartitionOf("ace", partitions))); msg.Subject != want {
		t.Errorf("stored on %s, want %s", msg.Subject, want)
	}
	if _, err := needs.Get(ctx, key); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("a KV get by the key: %v, want not found (it names the subject written, not the stored)", err)
	}
	if err := needs.Delete(ctx, key, jetstream.LastRevision(second)); err != nil {
		t.Fatalf("the delete at the key's revision: %v", err)
	}
	third, err := needs.Put(ctx, key, []byte("v3"))
	if err != nil {
		t.Fatal(err)
	}
	if msg, err := stream.GetLastMsgForSubject(ctx, stored.NodePrefix("ace")+"web.port.http"); err != nil || msg.Sequence != third {
		t.Errorf("the put after the delete is not the key's last: %v, %v", msg, err)
	}
}

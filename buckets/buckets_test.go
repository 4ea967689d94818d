package buckets_test

import (
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/natstest"
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
	msg := nats.NewMsg("$KV." + keys.NeedsBucket + ".ace.web.port.http")
	msg.Header.Set("Nats-Rollup", "all")
	if _, err := js.PublishMsg(ctx, msg); err == nil {
		t.Error("a Nats-Rollup: all publish was accepted")
	}
	if _, err := needs.Get(ctx, "novox.web.port.http"); err != nil {
		t.Errorf("novox's need after the rollup attempt: %v", err)
	}
}

package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// Every endpoint's stats data, as $SRV.STATS carries it, is an
// EndpointStatsData: every field present by its proto name, counts as JSON
// numbers, empty lists as [], nothing the message does not know; and its
// per-bucket counts are what a full read of each bucket counts.
func TestStatsDataIsTheMessage(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc, func(c *service.Config) {
		c.Seat = func() (bool, time.Time, string) { return true, time.Unix(1700000000, 0), "me" }
	})
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"http", "ssh"} {
		if _, err := ace.PutNeed(ctx, "web", "port", name, &provisionerv1.Need{Placeholder: "${port:" + name + "}"}); err != nil {
			t.Fatal(err)
		}
	}
	last, err := servicetest.Bucket(t, nc, keys.NeedsBucket).Put(ctx, "bob.web.port", nil) // malformed: three tokens
	if err != nil {
		t.Fatal(err)
	}
	c := client.New(nc)
	answers := map[string]*provisionerv1.ProvisioningResponse{}
	for what, bucket := range map[provisionerv1.What]string{
		provisionerv1.What_WHAT_REGISTRY: keys.RegistryBucket, provisionerv1.What_WHAT_NEEDS: keys.NeedsBucket,
		provisionerv1.What_WHAT_APPLIED: keys.AppliedBucket, provisionerv1.What_WHAT_COLLECT: keys.CollectBucket,
	} {
		minRevision := uint64(0)
		if bucket == keys.NeedsBucket {
			minRevision = last
		}
		if answers[bucket], err = c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: what, MinRevision: minRevision}); err != nil {
			t.Fatal(err)
		}
	}

	subject, err := micro.ControlSubject(micro.StatsVerb, wire.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	reply, err := nc.RequestWithContext(ctx, subject, nil)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(reply.Data, &stats); err != nil {
		t.Fatal(err)
	}
	if len(stats.Endpoints) == 0 {
		t.Fatal("no endpoint in the stats")
	}
	fields := (&provisionerv1.EndpointStatsData{}).ProtoReflect().Descriptor().Fields()
	for _, e := range stats.Endpoints {
		var raw map[string]any
		dec := json.NewDecoder(bytes.NewReader(e.Data))
		dec.UseNumber()
		if err := dec.Decode(&raw); err != nil {
			t.Fatalf("%s: data %s: %v", e.Name, e.Data, err)
		}
		for i := range fields.Len() {
			name := string(fields.Get(i).Name())
			if _, ok := raw[name]; !ok {
				t.Errorf("%s: data has no %s: %s", e.Name, name, e.Data)
			}
		}
		if len(raw) != fields.Len() {
			t.Errorf("%s: data has %d fields, the message %d: %s", e.Name, len(raw), fields.Len(), e.Data)
		}
		for _, name := range []string{"answered", "answer_errors", "shed", "queue_full", "asker_full", "slow_consumer", "refused_replies"} {
			if _, ok := raw[name].(json.Number); !ok {
				t.Errorf("%s: %s is %T, want a JSON number", e.Name, name, raw[name])
			}
		}
		if cache, ok := raw["answer_cache"].(map[string]any); !ok {
			t.Errorf("%s: answer_cache is %T", e.Name, raw["answer_cache"])
		} else if _, ok := cache["limit"].(json.Number); !ok {
			t.Errorf("%s: answer_cache.limit is %T, want a JSON number", e.Name, cache["limit"])
		}
		for _, name := range []string{"loading", "behind", "over_budget"} {
			if list, ok := raw[name].([]any); !ok || len(list) != 0 {
				t.Errorf("%s: %s is %#v, want []", e.Name, name, raw[name])
			}
		}
		// Decoded strictly, unlike wire.DecodeStatsData, which skips
		// unknown fields: the server writes none.
		data := &provisionerv1.EndpointStatsData{}
		if err := protojson.Unmarshal(e.Data, data); err != nil {
			t.Fatalf("%s: %v", e.Name, err)
		}
		if data.GetSeat() != "held" || data.GetSeatHolder() != "me" || data.GetSeatSince() != "2023-11-14T22:13:20Z" {
			t.Errorf("%s: seat %q since %q held by %q", e.Name, data.GetSeat(), data.GetSeatSince(), data.GetSeatHolder())
		}
		var order []string
		for _, b := range data.GetBuckets() {
			order = append(order, b.GetBucket())
			answer := answers[b.GetBucket()]
			records := len(answer.GetRegistry()) + len(answer.GetNeeds()) + len(answer.GetApplied()) + len(answer.GetCollect())
			if b.GetRecords() != uint64(records) || b.GetMalformed() != uint64(len(answer.GetMalformed())) || b.GetRevision() != answer.GetRevision() {
				t.Errorf("%s: bucket %v; a full read: %d records, %d malformed at revision %d",
					e.Name, b, records, len(answer.GetMalformed()), answer.GetRevision())
			}
		}
		if !slices.Equal(order, keys.Buckets()) {
			t.Errorf("%s: buckets %v, want %v", e.Name, order, keys.Buckets())
		}
		if b := data.GetBuckets()[1]; b.GetNodes() != 2 || b.GetRecords() != 2 || b.GetMalformed() != 1 {
			t.Errorf("%s: needs bucket %v, want 2 nodes (ace, bob), 2 records, 1 malformed", e.Name, b)
		}
	}
}

// A reader of stats skips the fields a newer instance's data holds that
// its message does not define, and reads the others; what is not an
// EndpointStatsData at all (a field of the wrong type) is an error.
func TestStatsDataOfANewerInstanceIsRead(t *testing.T) {
	t.Parallel()
	data, err := wire.DecodeStatsData([]byte(`{"answered": 1, "sections": {"hits": 2}, "seat": "held"}`))
	if err != nil {
		t.Fatal(err)
	}
	if data.GetAnswered() != 1 || data.GetSeat() != "held" {
		t.Errorf("read answered %d, seat %q; want 1, held", data.GetAnswered(), data.GetSeat())
	}
	if _, err := wire.DecodeStatsData([]byte(`{"answered": "many"}`)); err == nil {
		t.Error("answered as a word decodes")
	}
}

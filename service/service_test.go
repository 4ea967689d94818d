package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// mesh is a small mesh of two nodes, with malformed keys in every bucket.
type mesh struct {
	nc  *nats.Conn
	svc *service.Service
}

func put(t testing.TB, kv jetstream.KeyValue, key string, value []byte) uint64 {
	t.Helper()
	rev, err := kv.Put(context.Background(), key, value)
	if err != nil {
		t.Fatalf("put %s: %v", key, err)
	}
	return rev
}

// putRaw publishes to a key's subject directly, as a client that does not
// check keys would: the KV client refuses a key with a colon.
func putRaw(t *testing.T, nc *nats.Conn, bucket, key string, value []byte) uint64 {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := js.Publish(context.Background(), wire.KVSubject(bucket, key), value)
	if err != nil {
		t.Fatalf("publish %s: %v", key, err)
	}
	return ack.Sequence
}

func encode(t testing.TB, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

var garbage = []byte{0xff, 0xff, 0xff}

func newMesh(t *testing.T) *mesh {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	m := &mesh{nc: nc, svc: servicetest.Start(t, nc)}

	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	for _, key := range []string{"ace.web.port.http", "ace.web.secret.token", "ace.db.config.db_url", "novox.web.port.http"} {
		k, _ := keys.ParseNeedKey(key)
		put(t, needs, key, encode(t, &provisionerv1.Need{Placeholder: "${" + k.Kind + ":" + k.Name + "}", Required: true}))
	}
	put(t, needs, "ace.web.port", encode(t, &provisionerv1.Need{}))
	putRaw(t, nc, keys.NeedsBucket, "novox.web:api.port.http", encode(t, &provisionerv1.Need{}))
	lastNeed := put(t, needs, "ace.db.config.bad", garbage)

	applied := servicetest.Bucket(t, nc, keys.AppliedBucket)
	for _, key := range []string{"ace.web", "ace.db", "novox.web"} {
		put(t, applied, key, encode(t, &provisionerv1.Applied{PlanDigest: "sha256:" + key}))
	}
	put(t, applied, "ace.web.extra", encode(t, &provisionerv1.Applied{}))
	lastApplied := put(t, applied, "novox.api", garbage)

	collect := servicetest.Bucket(t, nc, keys.CollectBucket)
	for _, k := range []keys.CollectKey{
		{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web"},
		{Node: "ace", Collection: "shell:zsh:normal", Contributor: "db"},
		{Node: "ace", Collection: "environment", Contributor: "web"},
		{Node: "novox", Collection: "shell:zsh:normal", Contributor: "web"},
	} {
		key, err := k.Key()
		if err != nil {
			t.Fatal(err)
		}
		put(t, collect, key, encode(t, &provisionerv1.CollectItem{Value: "from " + k.Contributor}))
	}
	put(t, collect, "ace.shell=3a.web", encode(t, &provisionerv1.CollectItem{}))
	lastItem := put(t, collect, "ace.environment", encode(t, &provisionerv1.CollectItem{}))

	reg := servicetest.Bucket(t, nc, keys.RegistryBucket)
	put(t, reg, "weird", encode(t, &provisionerv1.RegistryEntry{Kind: "other"}))
	lastEntry := put(t, reg, "too.many", encode(t, &provisionerv1.RegistryEntry{Kind: "too"}))

	// The copy follows the buckets asynchronously: ask each bucket with the
	// revision of its last write, which answers once the copy holds it.
	for what, last := range map[provisionerv1.What]uint64{
		provisionerv1.What_WHAT_REGISTRY: lastEntry, provisionerv1.What_WHAT_NEEDS: lastNeed,
		provisionerv1.What_WHAT_APPLIED: lastApplied, provisionerv1.What_WHAT_COLLECT: lastItem,
	} {
		m.ask(t, &provisionerv1.ProvisioningRequest{What: what, MinRevision: last})
	}
	return m
}

func (m *mesh) ask(t *testing.T, req *provisionerv1.ProvisioningRequest) *provisionerv1.ProvisioningResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	answer, err := client.New(m.nc).Provisioning(ctx, req)
	if err != nil {
		t.Fatalf("Provisioning(%v): %v", req, err)
	}
	return answer
}

// keysOf renders every record and malformed key of an answer as its key.
func keysOf(t *testing.T, a *provisionerv1.ProvisioningResponse) (records, malformed []string) {
	t.Helper()
	add := func(key string, err error) {
		if err != nil {
			t.Fatal(err)
		}
		records = append(records, key)
	}
	for _, r := range a.GetRegistry() {
		add(keys.RegistryKey(r.GetKind()))
	}
	for _, r := range a.GetNeeds() {
		add(keys.NeedKey{Node: r.GetNode(), Module: r.GetModule(), Kind: r.GetKind(), Name: r.GetName()}.Key())
	}
	for _, r := range a.GetApplied() {
		add(keys.AppliedKey{Node: r.GetNode(), Module: r.GetModule()}.Key())
	}
	for _, r := range a.GetCollect() {
		add(keys.CollectKey{Node: r.GetNode(), Collection: r.GetCollection(), Contributor: r.GetContributor()}.Key())
	}
	for _, mk := range a.GetMalformed() {
		malformed = append(malformed, mk.GetKey())
	}
	return records, malformed
}

func TestProvisioningNarrowing(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	var sortedKinds []string
	for _, e := range registry.Table() {
		sortedKinds = append(sortedKinds, e.GetKind())
	}
	slices.Sort(sortedKinds)

	tests := []struct {
		name      string
		req       *provisionerv1.ProvisioningRequest
		records   []string
		malformed []string
	}{
		{"empty request is the registry", &provisionerv1.ProvisioningRequest{}, sortedKinds, []string{"too.many", "weird"}},
		{"registry", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_REGISTRY}, sortedKinds, []string{"too.many", "weird"}},
		{"needs", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS},
			[]string{"ace.db.config.db_url", "ace.web.port.http", "ace.web.secret.token", "novox.web.port.http"},
			[]string{"ace.db.config.bad", "ace.web.port", "novox.web:api.port.http"}},
		{"needs of a node", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"},
			[]string{"ace.db.config.db_url", "ace.web.port.http", "ace.web.secret.token"},
			[]string{"ace.db.config.bad", "ace.web.port"}},
		{"needs of a module", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Module: "web"},
			[]string{"ace.web.port.http", "ace.web.secret.token", "novox.web.port.http"},
			[]string{"ace.web.port"}},
		{"needs of a node's module", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", Module: "web"},
			[]string{"ace.web.port.http", "ace.web.secret.token"},
			[]string{"ace.web.port"}},
		{"needs of another node", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "novox"},
			[]string{"novox.web.port.http"}, []string{"novox.web:api.port.http"}},
		{"needs of an unknown node", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "zed"}, nil, nil},
		{"applied", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED},
			[]string{"ace.db", "ace.web", "novox.web"}, []string{"ace.web.extra", "novox.api"}},
		{"applied of a node", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED, Node: "ace"},
			[]string{"ace.db", "ace.web"}, []string{"ace.web.extra"}},
		{"applied of a module", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED, Module: "web"},
			[]string{"ace.web", "novox.web"}, []string{"ace.web.extra"}},
		{"applied of a node's module", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED, Node: "novox", Module: "api"},
			nil, []string{"novox.api"}},
		{"collect", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT},
			[]string{"ace.environment.web", "ace.shell=3Azsh=3Anormal.db", "ace.shell=3Azsh=3Anormal.web", "novox.shell=3Azsh=3Anormal.web"},
			[]string{"ace.environment", "ace.shell=3a.web"}},
		{"collect of a collection", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Collection: "shell:zsh:normal"},
			[]string{"ace.shell=3Azsh=3Anormal.db", "ace.shell=3Azsh=3Anormal.web", "novox.shell=3Azsh=3Anormal.web"}, nil},
		{"collect of a contributor", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Contributor: "db"},
			[]string{"ace.shell=3Azsh=3Anormal.db"}, []string{"ace.environment"}},
		{"collect of a node's contributor", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Node: "ace", Contributor: "web"},
			[]string{"ace.environment.web", "ace.shell=3Azsh=3Anormal.web"}, []string{"ace.environment", "ace.shell=3a.web"}},
		{"collect with every filter", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Node: "ace", Collection: "environment", Contributor: "web"},
			[]string{"ace.environment.web"}, []string{"ace.environment"}},
		{"collect of a node's collection", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Node: "novox", Collection: "shell:zsh:normal"},
			[]string{"novox.shell=3Azsh=3Anormal.web"}, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			answer := m.ask(t, tt.req)
			records, malformed := keysOf(t, answer)
			if diff := cmp.Diff(tt.records, records); diff != "" {
				t.Errorf("records (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.malformed, malformed); diff != "" {
				t.Errorf("malformed keys (-want +got):\n%s", diff)
			}
			if answer.GetRevision() == 0 {
				t.Error("the answer carries no revision")
			}
		})
	}
}

func TestProvisioningRecordsFieldByField(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	answer := m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "novox"})
	want := &provisionerv1.ProvisioningResponse{
		What: provisionerv1.What_WHAT_NEEDS,
		Needs: []*provisionerv1.NeedRecord{{
			Node: "novox", Module: "web", Kind: "port", Name: "http",
			Need: &provisionerv1.Need{Placeholder: "${port:http}", Required: true},
		}},
		Malformed: []*provisionerv1.MalformedKey{{
			Bucket: keys.NeedsBucket, Key: "novox.web:api.port.http",
			Reason: `malformed key: "novox.web:api.port.http": token 2 (<module>) holds ':' at byte 3; a token holds only A-Z a-z 0-9 - _ = /`,
		}},
	}
	ignoreRevisions := protocmp.IgnoreFields(&provisionerv1.NeedRecord{}, "revision")
	if diff := cmp.Diff(want, answer, protocmp.Transform(), ignoreRevisions,
		protocmp.IgnoreFields(&provisionerv1.MalformedKey{}, "revision"),
		protocmp.IgnoreFields(&provisionerv1.ProvisioningResponse{}, "revision")); diff != "" {
		t.Errorf("answer (-want +got):\n%s", diff)
	}

	collect := m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Node: "ace", Contributor: "db"})
	if len(collect.GetCollect()) != 1 {
		t.Fatalf("collect answer: %v", collect)
	}
	if diff := cmp.Diff(&provisionerv1.CollectRecord{Node: "ace", Collection: "shell:zsh:normal", Contributor: "db", Item: &provisionerv1.CollectItem{Value: "from db"}},
		collect.GetCollect()[0], protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.CollectRecord{}, "revision")); diff != "" {
		t.Errorf("collect record (-want +got):\n%s", diff)
	}

	reasons := map[string]string{}
	for _, what := range []provisionerv1.What{provisionerv1.What_WHAT_REGISTRY, provisionerv1.What_WHAT_NEEDS, provisionerv1.What_WHAT_APPLIED, provisionerv1.What_WHAT_COLLECT} {
		for _, mk := range m.ask(t, &provisionerv1.ProvisioningRequest{What: what}).GetMalformed() {
			if mk.GetRevision() == 0 || mk.GetBucket() == "" {
				t.Errorf("malformed key %v lacks its bucket or revision", mk)
			}
			reasons[mk.GetBucket()+" "+mk.GetKey()] = mk.GetReason()
		}
	}
	for key, want := range map[string]string{
		keys.RegistryBucket + " weird":           `key "weird" holds the entry of kind "other"`,
		keys.RegistryBucket + " too.many":        "has 2 tokens, want 1",
		keys.NeedsBucket + " ace.web.port":       "has 3 tokens, want 4",
		keys.NeedsBucket + " ace.db.config.bad":  "value of 3 bytes does not decode as mesh.provisioner.v1.Need",
		keys.AppliedBucket + " novox.api":        "value of 3 bytes does not decode as mesh.provisioner.v1.Applied",
		keys.AppliedBucket + " ace.web.extra":    "has 3 tokens, want 2",
		keys.CollectBucket + " ace.shell=3a.web": "token 2 (<collection>) has a bad escape",
		keys.CollectBucket + " ace.environment":  "has 2 tokens, want 3",
	} {
		if !strings.Contains(reasons[key], want) {
			t.Errorf("reason for %s = %q, want it to say %q", key, reasons[key], want)
		}
	}
}

func TestProvisioningFollowsTheBuckets(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	needs := servicetest.Bucket(t, m.nc, keys.NeedsBucket)
	req := &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", Module: "web"}

	// Each answer is asked with the revision of the last write (read your
	// writes): the service answers once its copy holds it.
	req.MinRevision = put(t, needs, "ace.web.dir.state", encode(t, &provisionerv1.Need{Placeholder: "${dir:state}"}))
	answer := m.ask(t, req)
	if answer.GetRevision() < req.GetMinRevision() {
		t.Fatalf("answered at revision %d, before the write at %d", answer.GetRevision(), req.GetMinRevision())
	}
	records, _ := keysOf(t, answer)
	rev := req.GetMinRevision()
	if !slices.Contains(records, "ace.web.dir.state") {
		t.Errorf("a need written at revision %d is not answered: %v", rev, records)
	}

	if err := needs.Delete(context.Background(), "ace.web.dir.state"); err != nil {
		t.Fatal(err)
	}
	if err := needs.Delete(context.Background(), "ace.web.port"); err != nil {
		t.Fatal(err)
	}
	st, err := needs.Status(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	req.MinRevision = st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
	records, malformed := keysOf(t, m.ask(t, req))
	if len(malformed) != 0 {
		t.Errorf("after delete, malformed %v, want none", malformed)
	}
	if diff := cmp.Diff([]string{"ace.web.port.http", "ace.web.secret.token"}, records); diff != "" {
		t.Errorf("after delete (-want +got):\n%s", diff)
	}
}

// raw sends a request as bytes, with an optional Content-Type.
func raw(t *testing.T, nc *nats.Conn, contentType string, body []byte) *nats.Msg {
	t.Helper()
	return rawTo(t, nc, wire.ProvisioningSubject, contentType, body)
}

// rawTo sends body to a verb's subject as it is, with the content type
// given, if any.
func rawTo(t *testing.T, nc *nats.Conn, subject, contentType string, body []byte) *nats.Msg {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = body
	if contentType != "" {
		msg.Header.Set("Content-Type", contentType)
	}
	reply, err := nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("request %q: %v", body, err)
	}
	return reply
}

//nolint:tparallel // the refusals run in parallel in their group; the check after them must not.
func TestProvisioningRefusesBadRequests(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	binary := func(req *provisionerv1.ProvisioningRequest) []byte { return encode(t, req) }
	tests := []struct {
		name        string
		contentType string
		body        []byte
		says        string
	}{
		{"garbage bytes", "", []byte{0xff, 0xfe, 0xfd, 0x00}, "does not decode as protobuf mesh.provisioner.v1.ProvisioningRequest"},
		{"unknown what in JSON", wire.ContentTypeJSON, []byte(`{"what":"WHAT_EVERYTHING"}`), "WHAT_EVERYTHING"},
		{"unknown what by number in JSON", "", []byte(`{"what":9}`), "what 9 is not one of WHAT_REGISTRY, WHAT_NEEDS, WHAT_APPLIED, WHAT_COLLECT"},
		{"unknown what in binary", "", binary(&provisionerv1.ProvisioningRequest{What: 7}), "what 7 is not one of"},
		{"broken JSON", wire.ContentTypeJSON, []byte(`{"what":`), "the JSON request does not decode"},
		{"node filter on the registry", "", binary(&provisionerv1.ProvisioningRequest{Node: "ace"}), "filter node does not apply to WHAT_REGISTRY, which is narrowed by nothing"},
		{"contributor filter on needs", "", binary(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Contributor: "web"}), "filter contributor does not apply to WHAT_NEEDS, which is narrowed by node, module"},
		{"collection filter on applied", "", []byte(`{"what":"WHAT_APPLIED","collection":"shell"}`), "filter collection does not apply to WHAT_APPLIED"},
		{"module filter on collect", "", binary(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Module: "web"}), "filter module does not apply to WHAT_COLLECT, which is narrowed by node, contributor, collection"},
		{"node that no key can hold", "", binary(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace.web"}), `filter node "ace.web" can match no key`},
		{"wildcard module", "", []byte(`{"what":"WHAT_NEEDS","module":">"}`), `filter module ">" can match no key`},
		{"a node name longer than a name may be", "", binary(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: strings.Repeat("a", 900_000)}), `filter node "` + strings.Repeat("a", 64) + `…" is 900000 bytes, more than the 256 a name may take: shorten it`},
		{"a collection longer than a name may be", "", binary(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Collection: strings.Repeat("a", 257)}), " is 257 bytes, more than the 256"},
	}
	// The group returns once its parallel subtests have all finished.
	t.Run("refused", func(t *testing.T) {
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				reply := raw(t, m.nc, tt.contentType, tt.body)
				err := wire.ErrorOf(reply)
				var serr *wire.Error
				if !errors.As(err, &serr) || serr.Code() != wire.CodeBadRequest {
					t.Fatalf("reply error = %v, want a 400", err)
				}
				if !strings.Contains(serr.Sentence(), tt.says) {
					t.Errorf("sentence %q does not say %q", serr.Sentence(), tt.says)
				}
			})
		}
	})
	if got := len(m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS}).GetNeeds()); got != 4 {
		t.Errorf("after bad requests, needs answered %d records, want 4", got)
	}
	if got := m.svc.Stats().Endpoints[0].NumErrors; got < len(tests) {
		t.Errorf("micro counted %d errors, want at least the %d refusals", got, len(tests))
	}
}

// protowireField returns a varint field with the given number: one no
// request defines.
func protowireField(number protowire.Number) []byte {
	return protowire.AppendVarint(protowire.AppendTag(nil, number, protowire.VarintType), 1)
}

func TestProvisioningEncodings(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	req := &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Node: "ace", Collection: "shell:zsh:normal"}
	want := m.ask(t, req)
	body, err := protojson.Marshal(req)
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name, contentType string
		body              []byte
		json              bool
	}{
		{"JSON by header", wire.ContentTypeJSON, body, true},
		{"JSON by header with charset", "application/json; charset=utf-8", body, true},
		{"JSON by its first byte", "", append([]byte("  "), body...), true},
		{"binary by header", wire.ContentTypeProtobuf, encode(t, req), false},
		{"binary by default", "", encode(t, req), false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reply := raw(t, m.nc, tt.contentType, tt.body)
			if err := wire.ErrorOf(reply); err != nil {
				t.Fatal(err)
			}
			got := &provisionerv1.ProvisioningResponse{}
			wantType := wire.ContentTypeProtobuf
			var err error
			if tt.json {
				wantType = wire.ContentTypeJSON
				err = protojson.Unmarshal(reply.Data, got)
			} else {
				err = proto.Unmarshal(reply.Data, got)
			}
			if err != nil {
				t.Fatalf("decode answer: %v\n%s", err, reply.Data)
			}
			if ct := reply.Header.Get("Content-Type"); ct != wantType {
				t.Errorf("answer Content-Type = %q, want %q", ct, wantType)
			}
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("answer (-binary +this encoding):\n%s", diff)
			}
		})
	}
	t.Run("the header wins over the first byte, in any case", func(t *testing.T) {
		t.Parallel()
		msg := nats.NewMsg(wire.ProvisioningSubject)
		msg.Header["content-type"] = []string{wire.ContentTypeProtobuf}
		msg.Data = body // JSON, read as protobuf as the header says
		reply, err := m.nc.RequestMsg(msg, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		var serr *wire.Error
		if err := wire.ErrorOf(reply); !errors.As(err, &serr) || !strings.Contains(serr.Sentence(), "does not decode as protobuf") {
			t.Errorf("JSON sent as protobuf: %v, want a 400 saying it does not decode as protobuf", err)
		}
	})
	t.Run("empty JSON body is the registry", func(t *testing.T) {
		t.Parallel()
		reply := raw(t, m.nc, wire.ContentTypeJSON, nil)
		got := &provisionerv1.ProvisioningResponse{}
		if err := protojson.Unmarshal(reply.Data, got); err != nil {
			t.Fatalf("decode: %v (%s)", err, reply.Data)
		}
		if got.GetWhat() != provisionerv1.What_WHAT_REGISTRY || len(got.GetRegistry()) != len(registry.Table()) {
			t.Errorf("empty request answered %v", got)
		}
	})
	t.Run("JSON names", func(t *testing.T) {
		t.Parallel()
		reply := raw(t, m.nc, "", []byte(`{"what":"WHAT_APPLIED","node":"ace","module":"web"}`))
		var doc map[string]any
		if err := json.Unmarshal(reply.Data, &doc); err != nil {
			t.Fatal(err)
		}
		applied := doc["applied"].([]any)[0].(map[string]any)
		if applied["node"] != "ace" || applied["module"] != "web" || applied["applied"].(map[string]any)["planDigest"] != "sha256:ace.web" {
			t.Errorf("JSON answer: %s", reply.Data)
		}
	})
}

func TestDiscovery(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	for range 3 {
		raw(t, m.nc, "", []byte{0xff})
	}
	before := m.svc.Info()
	var info micro.Info
	requestJSON(t, m.nc, micro.InfoVerb, &info)
	if info.Name != wire.ServiceName || info.Version != "1.2.3" || info.ID != before.ID {
		t.Errorf("INFO names %s %s %s", info.Name, info.Version, info.ID)
	}
	if len(info.Endpoints) != 10 || info.Endpoints[1].Name != wire.ComposeEndpoint || info.Endpoints[1].Subject != wire.ComposeSubject ||
		info.Endpoints[3].Subject != wire.NodeSubject(wire.ComposeSubject, "*") || info.Endpoints[4].Subject != wire.ProviderSubject("*") ||
		info.Endpoints[8].Subject != wire.DeclareSubjectOf("*", "*") || info.Endpoints[9].Subject != wire.BindSubject+".*" {
		t.Fatalf("INFO endpoints: %+v", info.Endpoints)
	}
	if got := info.Endpoints[1].Metadata["request"]; got != "mesh.provisioner.v1.ComposeRequest" {
		t.Errorf("compose endpoint request type %q", got)
	}
	ep := info.Endpoints[0]
	if ep.Name != wire.ProvisioningEndpoint || ep.Subject != wire.ProvisioningSubject {
		t.Errorf("endpoint %s on %s", ep.Name, ep.Subject)
	}
	if diff := cmp.Diff(map[string]string{
		"request":       "mesh.provisioner.v1.ProvisioningRequest",
		"response":      "mesh.provisioner.v1.ProvisioningResponse",
		"content_types": "application/protobuf, application/json",
	}, ep.Metadata); diff != "" {
		t.Errorf("endpoint metadata (-want +got):\n%s", diff)
	}

	var ping micro.Ping
	requestJSON(t, m.nc, micro.PingVerb, &ping)
	if ping.ID != before.ID {
		t.Errorf("PING answered by %s, want %s", ping.ID, before.ID)
	}

	// micro counts a request once its callback returns, which may be just
	// after the answer arrived and the service counted it answered: the
	// counts are read until both have counted every request.
	var stats micro.Stats
	natstest.CheckFor(t, 5*time.Second, func() error {
		requestJSON(t, m.nc, micro.StatsVerb, &stats)
		st := stats.Endpoints[0]
		// newMesh asked until its copy caught up: at least one good
		// request.
		if st.NumErrors != 3 || st.NumRequests < 4 {
			return fmt.Errorf("STATS: %d requests, %d errors; want >= 4 and 3", st.NumRequests, st.NumErrors)
		}
		var data struct {
			Answered uint64 `json:"answered"`
		}
		if err := json.Unmarshal(st.Data, &data); err != nil || data.Answered != uint64(st.NumRequests-st.NumErrors) {
			return fmt.Errorf("STATS data %s (err %w): want answered = %d", st.Data, err, st.NumRequests-st.NumErrors)
		}
		return nil
	})
}

func requestJSON(t *testing.T, nc *nats.Conn, verb micro.Verb, into any) {
	t.Helper()
	subject, err := micro.ControlSubject(verb, wire.ServiceName, "")
	if err != nil {
		t.Fatal(err)
	}
	reply, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if err := json.Unmarshal(reply.Data, into); err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
}

func TestNotReadyUntilLoaded(t *testing.T) {
	t.Parallel()
	// The service's user may not create consumers on the needs stream, so
	// its watcher of that bucket never loads.
	s := natstest.StartDenying(t, "svc", "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_needs", "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_needs.>")
	admin := natstest.Connect(t, s, nats.UserInfo("admin", "admin"))
	js, _ := jetstream.New(admin)
	if err := buckets.Ensure(t.Context(), js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	// nats-server's refusals of the watcher's consumers, as they come.
	refused := make(chan struct{}, 16) // a refusal of the needs watcher's consumer
	nc := natstest.Connect(t, s, nats.UserInfo("svc", "svc"), nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if strings.Contains(err.Error(), "KV_mesh-provisioner_needs") {
			select {
			case refused <- struct{}{}:
			default:
			}
		}
	}))
	svc, err := service.Start(t.Context(), service.Config{Conn: nc, Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Stop)

	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	// Every node's needs wait for the whole copy (a node's own are read
	// alone meanwhile: TestVerbsWhileLoadingAnswerAsTheCopy). Asked until
	// nats-server has refused the needs watcher's consumer twice, and once
	// more after: the watcher failed, tried again and failed again, and
	// the 503 lasts through it, the copy that cannot load.
	var serr *wire.Error
	for refusals := 0; ; refusals++ {
		_, err = client.New(admin).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS})
		if !errors.As(err, &serr) || serr.Code() != wire.CodeUnavailable {
			t.Fatalf("Provisioning before load, after %d refusals of the needs watcher's consumer = %v, want a 503", refusals, err)
		}
		if refusals == 2 {
			break
		}
		select {
		case <-refused:
		case <-ctx.Done():
			t.Fatalf("nats-server refused the needs watcher's consumer %d times in 30s, want 2", refusals)
		}
	}
	if !strings.Contains(serr.Sentence(), keys.NeedsBucket) || !strings.Contains(serr.Sentence(), "ask again") {
		t.Errorf("503 sentence %q should name the bucket and say to ask again", serr.Sentence())
	}
	// A bad request is still a 400, not a 503: the request is checked first.
	_, err = client.New(admin).Provisioning(ctx, &provisionerv1.ProvisioningRequest{Node: "ace"})
	if !errors.As(err, &serr) || serr.Code() != wire.CodeBadRequest {
		t.Errorf("bad request before load = %v, want a 400", err)
	}
}

func TestAnswersLargerThanMaxPayloadArePaged(t *testing.T) {
	t.Parallel()
	s := natstest.StartWithConfig(t, "max_payload: 2048")
	nc := natstest.Connect(t, s)
	servicetest.Start(t, nc)
	c := client.New(nc)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var whole []*provisionerv1.RegistryRecord
	for _, e := range registry.Table() {
		whole = append(whole, &provisionerv1.RegistryRecord{Kind: e.GetKind(), Entry: e})
	}
	slices.SortFunc(whole, func(a, b *provisionerv1.RegistryRecord) int { return strings.Compare(a.GetKind(), b.GetKind()) })

	for _, tt := range []struct {
		name     string
		pageSize uint32
	}{{"pages filled to max_payload", 0}, {"pages of three", 3}} {
		var got []*provisionerv1.RegistryRecord
		pages := 0
		for page, err := range c.ProvisioningPages(ctx, &provisionerv1.ProvisioningRequest{PageSize: tt.pageSize}) {
			if err != nil {
				t.Fatalf("%s: page %d: %v", tt.name, pages+1, err)
			}
			if size := proto.Size(page); size > 2048 {
				t.Errorf("%s: page %d is %d bytes, over max_payload", tt.name, pages+1, size)
			}
			if tt.pageSize > 0 && len(page.GetRegistry()) > int(tt.pageSize) {
				t.Errorf("%s: page %d holds %d records, over page_size", tt.name, pages+1, len(page.GetRegistry()))
			}
			got = append(got, page.GetRegistry()...)
			pages++
		}
		if pages < 2 {
			t.Errorf("%s: the registry came in %d page, want several under a 2 KiB max_payload", tt.name, pages)
		}
		if diff := cmp.Diff(whole, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.RegistryRecord{}, "revision")); diff != "" {
			t.Errorf("%s: pages joined (-want +got):\n%s", tt.name, diff)
		}
	}

	// JSON pages fit too: JSON is larger than binary for the same records.
	reply := raw(t, nc, wire.ContentTypeJSON, []byte(`{"what":"WHAT_REGISTRY"}`))
	if err := wire.ErrorOf(reply); err != nil || len(reply.Data) > 2048 {
		t.Fatalf("first JSON page: %d bytes, %v", len(reply.Data), err)
	}
	var first provisionerv1.ProvisioningResponse
	if err := protojson.Unmarshal(reply.Data, &first); err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first JSON page: %v, next_page_token %q", err, first.GetNextPageToken())
	}

	// A token that was edited, or sent with other filters, is a 400.
	token := first.GetNextPageToken()
	tampered := token[:len(token)-2] + map[bool]string{true: "AA", false: "BB"}[token[len(token)-2:] != "AA"]
	for _, tt := range []struct {
		name string
		req  *provisionerv1.ProvisioningRequest
		says string
	}{
		{"edited", &provisionerv1.ProvisioningRequest{PageToken: tampered}, "checksum does not match"},
		{"not base64", &provisionerv1.ProvisioningRequest{PageToken: "not a token!"}, "not a token this service issued"},
		{"other request", &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, PageToken: token}, "issued for another request"},
	} {
		_, err := c.Provisioning(ctx, tt.req)
		if wire.CodeOf(err) != wire.CodeBadRequest || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s token: %v, want a 400 saying %q", tt.name, err, tt.says)
		}
	}
}

// A page is filled up to PageMaxBytes, well under max_payload, and a record
// larger than that still comes, alone on its page.
func TestPagesAreFilledToPageMaxBytes(t *testing.T) {
	t.Parallel()
	const pageMax = 4 << 10
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc, func(c *service.Config) { c.PageMaxBytes = pageMax })
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	var want []*provisionerv1.NeedRecord
	var last uint64
	for i := range 21 {
		local := strings.Repeat("x", 1000)
		if i == 10 {
			local = strings.Repeat("y", 3*pageMax) // alone over a page
		}
		need := &provisionerv1.Need{Placeholder: fmt.Sprintf("${dir:d%02d}", i), Local: local}
		name := fmt.Sprintf("d%02d", i)
		last = put(t, needs, "ace.web.dir."+name, encode(t, need))
		want = append(want, &provisionerv1.NeedRecord{Node: "ace", Module: "web", Kind: "dir", Name: name, Need: need})
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var got []*provisionerv1.NeedRecord
	pages := 0
	for page, err := range client.New(nc).ProvisioningPages(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: last}) {
		if err != nil {
			t.Fatalf("page %d: %v", pages+1, err)
		}
		pages++
		if size, n := proto.Size(page), len(page.GetNeeds()); size > pageMax && n != 1 {
			t.Errorf("page %d is %d bytes of %d records, over PageMaxBytes (%d)", pages, size, n, pageMax)
		}
		got = append(got, page.GetNeeds()...)
	}
	if pages < 6 {
		t.Errorf("21 records of 1 KB or more came in %d pages, want six or more (some four in a page of %d bytes)", pages, pageMax)
	}
	if diff := cmp.Diff(want, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.NeedRecord{}, "revision")); diff != "" {
		t.Errorf("pages joined (-want +got):\n%s", diff)
	}

	// A composition likewise, of bob's 200 needs, some 130 bytes each: the
	// first chunk measured is all of them, more than a page.
	for i := range 200 {
		name := fmt.Sprintf("d%03d", i)
		last = put(t, needs, "bob.web.dir."+name, encode(t, &provisionerv1.Need{Placeholder: "${dir:" + name + "}"}))
	}
	composed, pages := 0, 0
	for page, err := range client.New(nc).ComposePages(ctx, &provisionerv1.ComposeRequest{Node: "bob", MinRevisions: &provisionerv1.Revisions{Needs: last}}) {
		if err != nil {
			t.Fatalf("compose page %d: %v", pages+1, err)
		}
		pages++
		if size := proto.Size(page); size > pageMax {
			t.Errorf("compose page %d is %d bytes, over PageMaxBytes (%d)", pages, size, pageMax)
		}
		for _, plan := range page.GetPlans() {
			composed += len(plan.GetItems())
		}
	}
	if pages < 4 || composed != 200 {
		t.Errorf("compose: %d needs in %d pages, want 200 in four or more", composed, pages)
	}
}

// TestUnknownFieldsAreIgnored: a request from a newer client, with fields
// this server does not define, is answered as if they were absent, in both
// encodings, so that instances of several versions can serve one queue
// group during a rolling upgrade.
func TestUnknownFieldsAreIgnored(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	want := m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"})
	known := encode(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"})
	for name, body := range map[string][]byte{
		"binary": append(known, protowireField(99)...),
		"JSON":   []byte(`{"what":"WHAT_NEEDS","node":"ace","nextYearsFilter":{"x":1}}`),
	} {
		reply := raw(t, m.nc, "", body)
		if err := wire.ErrorOf(reply); err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := &provisionerv1.ProvisioningResponse{}
		if err := decodeAnswer(reply, got); err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(want.GetNeeds(), got.GetNeeds(), protocmp.Transform()); diff != "" {
			t.Errorf("%s: needs (-want +got):\n%s", name, diff)
		}
	}
}

// decodeAnswer decodes an answer in the encoding its Content-Type names.
func decodeAnswer(reply *nats.Msg, into proto.Message) error {
	if reply.Header.Get("Content-Type") == wire.ContentTypeJSON {
		return protojson.Unmarshal(reply.Data, into)
	}
	return proto.Unmarshal(reply.Data, into)
}

package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/google/go-cmp/cmp"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/wire"
)

// refusedReplies returns each endpoint's refused_replies from $SRV.STATS.
func refusedReplies(t *testing.T, nc *nats.Conn) map[string]uint64 {
	t.Helper()
	var stats micro.Stats
	requestJSON(t, nc, micro.StatsVerb, &stats)
	out := map[string]uint64{}
	for _, ep := range stats.Endpoints {
		var data struct {
			RefusedReplies uint64 `json:"refused_replies"`
		}
		if err := json.Unmarshal(ep.Data, &data); err != nil {
			t.Fatal(err)
		}
		out[ep.Name] = data.RefusedReplies
	}
	return out
}

// streamStates returns each stream's message count and last sequence.
func streamStates(t *testing.T, nc *nats.Conn) map[string]string {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for info := range js.ListStreams(context.Background()).Info() {
		out[info.Config.Name] = fmt.Sprintf("msgs=%d last=%d", info.State.Msgs, info.State.LastSeq)
	}
	return out
}

// TestAnswersGoOnlyToInboxes sends a request down every answer path (an
// answer, a reused answer, a page, each kind of refusal, a revision wait)
// with reply subjects that are not inboxes: a JetStream API subject, a KV
// key, the seat, the server's own inbox, a subject of no one. None is
// answered, each is counted, and no stream changes; the same requests to an
// inbox are answered.
func TestAnswersGoOnlyToInboxes(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()

	// A first page, so that the page path is asked with a real token, and
	// the registry once through an inbox, so that its answer is cached and
	// the reuse path is taken below.
	first, err := client.New(m.nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, PageSize: 1})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("first page: %v, %v", first, err)
	}
	m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_REGISTRY})

	jsonOf := func(req *provisionerv1.ProvisioningRequest) string { return protojson.Format(req) }
	paths := []struct {
		name, subject, body string
	}{
		{"an answer", wire.ProvisioningSubject, jsonOf(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"})},
		{"a reused answer", wire.ProvisioningSubject, jsonOf(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_REGISTRY})},
		{"a next page", wire.ProvisioningSubject, jsonOf(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, PageSize: 1, PageToken: first.GetNextPageToken()})},
		{"a 400 for a body that does not decode", wire.ProvisioningSubject, `{"bogus":1}`},
		{"a 400 for a filter that does not apply", wire.ProvisioningSubject, `{"what":"WHAT_REGISTRY","node":"ace"}`},
		{"a 503 after a revision wait", wire.ProvisioningSubject, `{"what":"WHAT_NEEDS","minRevision":"999999"}`},
		{"a composition", wire.ComposeSubject, `{"node":"ace"}`},
		{"a 400 of compose", wire.ComposeSubject, `{}`},
	}
	targets := []string{
		"$JS.API.STREAM.PURGE.KV_mesh-provisioner_needs",
		"$JS.API.STREAM.DELETE.KV_mesh-provisioner_collect",
		wire.KVSubject(keys.RegistryBucket, "evil"),
		wire.KVSubject(keys.NeedsBucket, "novox.web.port.evil"),
		wire.SeatSubject,
		wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".x",
		"$SYS.REQ.SERVER.PING",
		"evil.answer",
		"_INBOX",            // a prefix without its dot is not an inbox
		"_INBOX_MESH.node.", // nor is the prefix alone
		// A request on a bare subject is no node's or provider's: their
		// inboxes get no answer of it.
		wire.InboxPrefix(wire.RoleNode, "ace") + ".x",
		wire.InboxPrefix(wire.RoleProvider, "pg") + ".x",
	}
	// What the targets receive: nothing, if no answer reaches them.
	var received []string
	sub, err := m.nc.Subscribe(">", func(msg *nats.Msg) {
		for _, target := range targets {
			if msg.Subject == target {
				received = append(received, msg.Subject)
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	before := streamStates(t, m.nc)
	counted := refusedReplies(t, m.nc)

	want := map[string]uint64{}
	for _, path := range paths {
		for _, target := range append([]string{""}, targets...) { // "": no reply subject at all
			msg := &nats.Msg{Subject: path.subject, Reply: target, Data: []byte(path.body)}
			if err := m.nc.PublishMsg(msg); err != nil {
				t.Fatal(err)
			}
			want[map[string]string{wire.ProvisioningSubject: wire.ProvisioningEndpoint, wire.ComposeSubject: wire.ComposeEndpoint}[path.subject]]++
		}
	}
	for name, n := range counted {
		want[name] += n
	}
	// The count is taken on the callback, before anything could be sent:
	// once it is reached, every request above has been dealt with.
	natstest.CheckFor(t, 5*time.Second, func() error {
		if got := refusedReplies(t, m.nc); !cmp.Equal(want, got) {
			return fmt.Errorf("refused_replies %v, want %v", got, want)
		}
		return nil
	})
	// The same requests to an inbox are answered; an answer to each kind of
	// inbox. ("_R_." is not here: nats-server refuses it as a client's reply
	// subject, and makes it only for a request from another account.)
	answered := func(subject, reply, body string) error {
		answers, err := m.nc.SubscribeSync(reply)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = answers.Unsubscribe() }()
		if err := m.nc.PublishRequest(subject, reply, []byte(body)); err != nil {
			t.Fatal(err)
		}
		_, err = answers.NextMsg(10 * time.Second)
		return err
	}
	for _, path := range paths {
		if err := answered(path.subject, nats.NewInbox(), path.body); err != nil {
			t.Errorf("%s to an inbox: %v", path.name, err)
		}
	}
	// Each identity's request on its own subject is answered into its own
	// inbox; a request on a bare subject into an operator's inbox or
	// nats.go's, and into no node's or provider's (issue 37: answers only
	// to the asker).
	for _, tt := range []struct{ subject, reply string }{
		{wire.NodeSubject(wire.ProvisioningSubject, "ace"), wire.InboxPrefix(wire.RoleNode, "ace") + ".1"},
		{wire.ProviderSubject("pg"), wire.InboxPrefix(wire.RoleProvider, "pg") + ".1"},
		{paths[0].subject, wire.InboxPrefix(wire.RoleOperator, "ops") + ".1"},
	} {
		if err := answered(tt.subject, tt.reply, `{"provider":"pg"}`); err != nil {
			t.Errorf("%s to %s: %v", tt.subject, tt.reply, err)
		}
	}
	if err := sub.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	if len(received) != 0 {
		t.Errorf("answers reached %v", received)
	}
	if diff := cmp.Diff(before, streamStates(t, m.nc)); diff != "" {
		t.Errorf("the streams changed (-before +after):\n%s", diff)
	}
}

// TestReplyPrefixes: a mesh's own prefixes replace the defaults, and a
// prefix that could reach anything but an inbox is refused at start.
func TestReplyPrefixes(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	for _, prefixes := range [][]string{{}, {""}, {"_INBOX"}, {"$JS."}, {"_INBOX.*."}, {">"}, {"a..b."}, {"_INBOX.", ".x."}} {
		_, err := service.Start(t.Context(), service.Config{Conn: nc, ReplyPrefixes: prefixes})
		if !errors.Is(err, admission.ErrReplyPrefix) {
			t.Errorf("ReplyPrefixes %q: %v, want ErrReplyPrefix", prefixes, err)
		}
	}

	servicetest.Start(t, nc, func(c *service.Config) { c.ReplyPrefixes = []string{"MY_REPLIES."} })
	ask := func(reply string) error {
		answers, err := nc.SubscribeSync(reply)
		if err != nil {
			t.Fatal(err)
		}
		defer func() { _ = answers.Unsubscribe() }()
		if err := nc.PublishRequest(wire.ProvisioningSubject, reply, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
		_, err = answers.NextMsg(time.Second)
		return err
	}
	if err := ask("MY_REPLIES.1"); err != nil {
		t.Errorf("a reply under the mesh's own prefix: %v", err)
	}
	if err := ask("_INBOX.1"); !errors.Is(err, nats.ErrTimeout) {
		t.Errorf("a default prefix the mesh replaced: %v, want no answer", err)
	}
}

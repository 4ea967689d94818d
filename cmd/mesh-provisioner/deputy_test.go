package main

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/wire"
)

// replyTarget is a subject an attacker names as the reply subject of a
// request to the verbs, hoping the service's answer is published there with
// the service's rights.
type replyTarget struct {
	name, subject string
	// inbox: an identity's inbox, which the answering identity may publish
	// to (it answers there); the service refuses it on another owner's
	// subject.
	inbox bool
}

// replyTargets are the reply subjects of the attacks: every JetStream API
// subject a request could aim at, for each of the five streams and for a
// stream of the attacker's own naming; a key of each bucket, another node's
// among them; the seat; system subjects; and the server's writer's inbox.
func replyTargets(meshStream string) []replyTarget {
	var out []replyTarget
	streams := []string{"EVIL"}
	if meshStream != "" {
		streams = append(streams, meshStream)
	}
	for _, bucket := range keys.Buckets() {
		streams = append(streams, wire.StreamOf(bucket))
	}
	for _, stream := range streams {
		for _, api := range []string{
			"STREAM.CREATE." + stream, "STREAM.UPDATE." + stream, "STREAM.DELETE." + stream, "STREAM.PURGE." + stream,
			"STREAM.MSG.DELETE." + stream, "STREAM.RESTORE." + stream, "STREAM.SNAPSHOT." + stream,
			"CONSUMER.CREATE." + stream, "CONSUMER.CREATE." + stream + ".evil", "CONSUMER.DURABLE.CREATE." + stream + ".evil",
			"CONSUMER.DELETE." + stream + ".evil",
		} {
			out = append(out, replyTarget{name: api, subject: "$JS.API." + api})
		}
	}
	for _, key := range []struct{ bucket, key string }{
		{keys.RegistryBucket, "config"}, {keys.RegistryBucket, "evil"},
		{keys.NeedsBucket, "novox.web.port.evil"}, {keys.NeedsBucket, "ace.web.port.evil"},
		{keys.AppliedBucket, "novox.evil"}, {keys.CollectBucket, "novox.evil.web"},
	} {
		out = append(out, replyTarget{name: "key " + key.key + " of " + key.bucket, subject: wire.KVSubject(key.bucket, key.key)})
	}
	return append(out,
		replyTarget{name: "the seat", subject: wire.SeatSubject},
		replyTarget{name: "a partition's seat", subject: wire.PartitionSeatSubject(0)},
		replyTarget{name: "the server's ping", subject: "$SYS.REQ.SERVER.PING"},
		replyTarget{name: "an account's connections", subject: "$SYS.REQ.ACCOUNT.PING.CONNZ"},
		replyTarget{name: "the writer's inbox", subject: wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".evil"},
		replyTarget{name: "another node's inbox", subject: wire.InboxPrefix(wire.RoleNode, "novox") + ".evil", inbox: true},
		replyTarget{name: "a provider's inbox", subject: wire.InboxPrefix(wire.RoleProvider, "pg") + ".evil", inbox: true},
		replyTarget{name: "the stream's flow control", subject: "$JS.FC." + wire.StreamOf(keys.NeedsBucket) + ".evil"},
		replyTarget{name: "an ack", subject: "$JS.ACK." + wire.StreamOf(keys.NeedsBucket) + ".evil.1.1.1.1.0"},
	)
}

// violatedReply reports whether the server has refused a publish of this
// identity's for naming subject as its reply subject.
func (id *identity) violatedReply(subject string) bool {
	want := fmt.Sprintf("Permissions Violation for Publish with Reply of %q", subject)
	id.mu.Lock()
	defer id.mu.Unlock()
	return slices.ContainsFunc(id.violations, func(v string) bool { return strings.Contains(v, want) })
}

// recorder records the subjects of the messages an unrestricted identity
// sees in its account: an answer that reached a target would show here.
type recorder struct {
	mu       sync.Mutex
	subjects map[string]int
}

func record(t *testing.T, id *identity) *recorder {
	t.Helper()
	r := &recorder{subjects: map[string]int{}}
	sub, err := id.nc.Subscribe(">", func(m *nats.Msg) {
		r.mu.Lock()
		r.subjects[m.Subject]++
		r.mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	if err := id.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return r
}

func (r *recorder) count(subject string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.subjects[subject]
}

// verbStats are the service's counts of what became of requests, every
// endpoint's summed, as its STATS says.
type verbStats struct {
	refusedReplies uint64 // left unanswered for their reply subject
	// handled counts every request that was dealt with, each once: answered,
	// answered with an error (by a worker or on the callback), or refused
	// for its reply subject.
	handled uint64
}

func statsOf(t *testing.T, asker *nats.Conn) verbStats {
	t.Helper()
	var sum verbStats
	for _, ep := range endpointStats(t, asker) {
		var data struct {
			RefusedReplies uint64 `json:"refused_replies"`
			Answered       uint64 `json:"answered"`
			AnswerErrors   uint64 `json:"answer_errors"`
			Refused        uint64 `json:"refused"`
		}
		if err := json.Unmarshal(ep.Data, &data); err != nil {
			t.Fatal(err)
		}
		sum.refusedReplies += data.RefusedReplies
		sum.handled += data.RefusedReplies + data.Answered + data.AnswerErrors + data.Refused + uint64(ep.NumErrors)
	}
	return sum
}

// attack sends, as attacker, each verb on its own subjects (all a node may
// publish) with the bodies of the attacks (an unknown field, an
// empty request, a node's request) and target as the reply subject.
func attack(t *testing.T, attacker *identity, target string) int {
	t.Helper()
	sent := 0
	for _, verb := range []string{wire.NodeSubject(wire.ProvisioningSubject, attacker.name), wire.NodeSubject(wire.ComposeSubject, attacker.name)} {
		for _, body := range []string{`{"bogus":1}`, `{}`, `{"node":"ace"}`} {
			if err := attacker.nc.PublishMsg(&nats.Msg{Subject: verb, Reply: target, Data: []byte(body)}); err != nil {
				t.Fatal(err)
			}
			sent++
		}
	}
	if err := attacker.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	return sent
}

// deputyMesh is a served mesh on an authorizing nats-server, with records
// of two nodes, the seat handed back so that the streams hold still.
type deputyMesh struct {
	attacker  *identity // node ace
	answering *identity // the service's answering identity
	admins    []*identity
}

func (m deputyMesh) snapshots(t *testing.T) []map[string]string {
	t.Helper()
	var out []map[string]string
	for _, admin := range m.admins {
		out = append(out, snapshot(t, admin.js))
	}
	return out
}

// serveAs starts the service as serve does, its two identities on s, and
// waits until its copy is loaded; stopSeat hands the seat back.
func serveAs(ctx context.Context, t *testing.T, s *server.Server) (answering *identity, stopSeat func()) {
	t.Helper()
	p := startProvisioner(ctx, t, s)
	return p.answering, p.stopSeat
}

// TestNoNodeCanMakeTheServiceWrite is the confused deputy, tried on a real
// authorizing nats-server: node ace names, as the reply subject of a request
// to either verb, every subject through which an answer could change
// something. Each row shows that no message reached the target, no stream
// changed and the refusal was counted by the service. Then the same targets
// are tried as the answering identity itself, as if the service's check had
// a bug: nats-server refuses every publish.
//
//nolint:tparallel // the rows count the service's refusals one after another.
func TestNoNodeCanMakeTheServiceWrite(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	answering, stopSeat := serveAs(ctx, t, s)
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	writeRecordsOf(ctx, t, ace, novox)
	stopSeat()
	admin := connectAs(t, s, "", "admin")
	m := deputyMesh{attacker: ace, answering: answering, admins: []*identity{admin}}
	seen := record(t, admin)
	before := m.snapshots(t)

	for _, target := range replyTargets("") {
		t.Run("ace aims an answer at "+target.name, func(t *testing.T) {
			refused := statsOf(t, admin.nc).refusedReplies
			sent := attack(t, ace, target.subject)
			natstest.CheckFor(t, 5*time.Second, func() error {
				got := statsOf(t, admin.nc).refusedReplies - refused
				if got == uint64(sent) {
					return nil
				}
				if got == 0 && ace.violatedReply(target.subject) {
					// nats-server reserves this subject ($JS.ACK, $JS.FC): no
					// client may name it as a reply, so the requests never
					// reached the service.
					return nil
				}
				return fmt.Errorf("the service counted %d refused replies of the %d requests", got, sent)
			})
			if n := seen.count(target.subject); n != 0 {
				t.Errorf("%d messages reached %s", n, target.subject)
			}
			if diff := cmp.Diff(before, m.snapshots(t)); diff != "" {
				t.Errorf("the streams changed (-before +after):\n%s", diff)
			}
		})
	}

	// Layer two alone: the answering identity cannot publish there at all
	// (but to inboxes, where it answers).
	for _, target := range replyTargets("") {
		if target.inbox {
			continue
		}
		if err := answering.nc.Publish(target.subject, nil); err != nil {
			t.Fatal(err)
		}
		if !answering.violated(target.subject) {
			t.Errorf("the answering identity published to %s with no permission violation", target.subject)
		}
	}
	if diff := cmp.Diff(before, m.snapshots(t)); diff != "" {
		t.Errorf("the streams changed (-before +after):\n%s", diff)
	}
}

// TestTheAnsweringIdentityPublishesOnlyToInboxes checks the printed
// permissions themselves: no allow_responses, and nothing but the reply
// prefixes to publish to.
func TestTheAnsweringIdentityPublishesOnlyToInboxes(t *testing.T) {
	t.Parallel()
	text := printed(t, "--server")
	if strings.Contains(text, "allow_responses") {
		t.Errorf("permissions --server grants allow_responses:\n%s", text)
	}
	var want []string
	for _, prefix := range wire.ReplyPrefixes() {
		want = append(want, prefix+">")
	}
	// and the discovery question an instance asks at start, answered on
	// its own inbox, and the relay subjects of a partitioned mesh, which
	// only the service's instances subscribe to
	want = append(want, "$SRV.INFO.mesh-provisioner", wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity)+".>", wire.RelayRoot+".>")
	if got := permissions.Server().Publish.Allow; !slices.Equal(got, want) {
		t.Errorf("the answering identity may publish %v, want only %v", got, want)
	}
	writer, err := permissions.ServerWriter("pg")
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{wire.ServiceName + ".>", "$SRV.>"} {
		if slices.Contains(writer.Subscribe.Allow, subject) || !slices.Contains(writer.Subscribe.Deny, subject) {
			t.Errorf("the writing identity may subscribe to %s, which nodes publish to", subject)
		}
	}
	if strings.Contains(printed(t, "--runs-as", "ace"), "allow_responses") {
		t.Error("permissions --runs-as grants allow_responses")
	}
}

// TestNoNodeCanMakeTheServiceWriteAcrossAccounts is the same attack in the
// runs-as set-up: ace, in MESH, asks the verbs PROVISIONER exports, naming
// JetStream and KV subjects as reply subjects. nats-server hands the
// service the reply as _R_.<token>, which it answers, and delivers the
// answer to ace's subject in MESH: no stream of either account may change,
// MESH's own stream among them.
func TestNoNodeCanMakeTheServiceWriteAcrossAccounts(t *testing.T) {
	t.Parallel()
	s := runsAsServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	answering, stopSeat := serveAs(ctx, t, s)
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	writeRecordsOf(ctx, t, ace, novox)
	stopSeat()
	admin, aceadmin := connectAs(t, s, "", "admin"), connectAs(t, s, "", "aceadmin")
	// MESH keeps a stream of its own, which ace's permissions cannot touch.
	const meshStream = "MESH_OWN"
	if _, err := aceadmin.js.CreateStream(ctx, jetstream.StreamConfig{Name: meshStream, Subjects: []string{"own.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := aceadmin.js.Publish(ctx, "own.1", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	m := deputyMesh{attacker: ace, answering: answering, admins: []*identity{admin, aceadmin}}
	before := m.snapshots(t)
	seen, seenInMesh := record(t, admin), record(t, aceadmin)

	handled := statsOf(t, admin.nc).handled
	sent := map[string]int{}
	for _, target := range replyTargets(meshStream) {
		sent[target.subject] = attack(t, ace, target.subject)
	}
	// Every request that reached the service is dealt with (answered to
	// _R_.<token>, mostly) before what it did is looked at. Those that name
	// a subject nats-server reserves ($JS.ACK, $JS.FC) never reach it.
	natstest.CheckFor(t, 10*time.Second, func() error {
		want := 0
		for subject, n := range sent {
			if !ace.violatedReply(subject) {
				want += n
			}
		}
		if got := statsOf(t, admin.nc).handled - handled; got != uint64(want) {
			return fmt.Errorf("the service dealt with %d of the %d requests that reached it", got, want)
		}
		return nil
	})
	if err := aceadmin.nc.Flush(); err != nil { // the answers' deliveries are behind the stats' answer
		t.Fatal(err)
	}
	for _, target := range replyTargets(meshStream) {
		if n := seen.count(target.subject); n != 0 {
			t.Errorf("%d messages reached %s in PROVISIONER", n, target.subject)
		}
	}
	if diff := cmp.Diff(before, m.snapshots(t)); diff != "" {
		t.Errorf("the streams changed (-before +after):\n%s", diff)
	}
	reached := 0
	for _, target := range replyTargets(meshStream) {
		reached += seenInMesh.count(target.subject)
	}
	t.Logf("requests sent with %d reply subjects; %d answers delivered to those subjects in MESH, none of which changed a stream", len(sent), reached)
}

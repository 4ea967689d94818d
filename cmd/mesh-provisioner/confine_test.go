package main

import (
	"bytes"
	"context"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/wire"
)

// readAttempt is one way node ace might try to read node novox's records or
// plan: a subject and a body.
type readAttempt struct {
	name, subject, body string
}

// readAttempts are every subject and filter through which ace might read
// novox: the unscoped verbs (for operators), novox's own subjects, ace's own
// subjects with filters naming novox or none, and the providers' verb.
func readAttempts() []readAttempt {
	var out []readAttempt
	for _, subject := range []string{
		wire.ProvisioningSubject, wire.NodeSubject(wire.ProvisioningSubject, "novox"), wire.NodeSubject(wire.ProvisioningSubject, "ace"),
	} {
		for _, what := range []string{"WHAT_NEEDS", "WHAT_APPLIED", "WHAT_COLLECT"} {
			for _, node := range []string{"", "novox"} {
				body := `{"what":"` + what + `"`
				if node != "" {
					body += `,"node":"` + node + `"`
				}
				out = append(out, readAttempt{what + " naming " + node + " on " + subject, subject, body + "}"})
			}
		}
		out = append(out, readAttempt{"WHAT_NEEDS of module web on " + subject, subject, `{"what":"WHAT_NEEDS","module":"web"}`})
	}
	for _, subject := range []string{wire.ComposeSubject, wire.NodeSubject(wire.ComposeSubject, "novox"), wire.NodeSubject(wire.ComposeSubject, "ace")} {
		out = append(out, readAttempt{"novox's plan on " + subject, subject, `{"node":"novox"}`})
	}
	for _, provider := range []string{"pg", "novox", "ace"} {
		out = append(out, readAttempt{"provider " + provider + "'s provisions", wire.ProviderSubject(provider), `{"provider":"` + provider + `"}`})
	}
	return out
}

// tryToRead makes each attempt as ace and checks that nats-server refused
// it (a permission violation) or the service did (a 403), and that no
// answer carries a byte of novox's.
func tryToRead(t *testing.T, ace *identity) {
	t.Helper()
	for _, a := range readAttempts() {
		msg := &nats.Msg{Subject: a.subject, Data: []byte(a.body), Header: nats.Header{"Content-Type": {wire.ContentTypeJSON}}}
		// A refused publish is never answered: the attempt ends when ctx
		// does, and the violation says why.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		reply, err := ace.nc.RequestMsgWithContext(ctx, msg)
		cancel()
		switch {
		case err != nil:
			if !ace.violated(a.subject) {
				t.Errorf("%s: %v, and no permission violation", a.name, err)
			}
		case wire.CodeOf(wire.ErrorOf(reply)) == wire.CodeForbidden:
		default:
			t.Errorf("%s: answered (%v) with %s", a.name, wire.ErrorOf(reply), reply.Data)
		}
		if reply != nil && bytes.Contains(reply.Data, []byte("novox")) {
			t.Errorf("%s: an answer carries novox's records: %s", a.name, reply.Data)
		}
	}
}

// readsItsOwn checks what ace may read: its own records, its own plan, the
// registry, on its own subjects, with an unknown JSON field answered as a
// newer client's would be.
func readsItsOwn(ctx context.Context, t *testing.T, ace *identity, lastNeed uint64) {
	t.Helper()
	c := client.New(ace.nc, client.AsNode("ace"))
	needs, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: lastNeed})
	if err != nil || len(needs.GetNeeds()) != 2 {
		t.Errorf("ace's needs: %v, %v; want its two", needs, err)
	}
	if registry, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{}); err != nil || len(registry.GetRegistry()) == 0 {
		t.Errorf("the registry on ace's subject: %v", err)
	}
	plan, err := c.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"})
	if err != nil || len(plan.GetPlans()) != 1 || len(plan.GetProvisions()) != 1 {
		t.Errorf("ace's plan: %v, %v; want web's with one provision", plan, err)
	}
	reply, err := ace.nc.Request(wire.NodeSubject(wire.ProvisioningSubject, "ace"), []byte(`{"what":"WHAT_APPLIED","node":"ace","fromANewerClient":true}`), 5*time.Second)
	if err != nil || wire.ErrorOf(reply) != nil || !bytes.Contains(reply.Data, []byte("sha256:ace")) {
		t.Errorf("an unknown JSON field on ace's subject: %v, %v", err, reply)
	}
}

// writeRecordsOf writes, as each node, a need asking provider pg and one
// that does not, an applied record and a collection item, and returns the
// last need's revision.
func writeRecordsOf(ctx context.Context, t *testing.T, ids ...*identity) uint64 {
	t.Helper()
	var last uint64
	for _, id := range ids {
		nc, err := nodeclient.New(ctx, nodeclient.Config{Conn: id.nc, Node: id.name})
		if err != nil {
			t.Fatalf("%s binds the state buckets: %v", id.name, err)
		}
		if _, err := nc.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}); err != nil {
			t.Fatal(err)
		}
		if last, err = nc.PutNeed(ctx, "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "database", Local: id.name}); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.PutApplied(ctx, "web", &provisionerv1.Applied{PlanDigest: "sha256:" + id.name}); err != nil {
			t.Fatal(err)
		}
		if _, err := nc.PutCollectItem(ctx, "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "export NODE=" + id.name}); err != nil {
			t.Fatal(err)
		}
	}
	return last
}

// TestEachNodeReadsOnlyItsOwn: on a nats-server whose authorization is what
// `permissions` prints, node ace reads its own records and plan and the
// registry, and every attempt to read novox's, through any subject and
// filter, is refused by nats-server or with a 403, with no byte of novox's
// in any answer; provider pg reads its provisions across the mesh and
// nothing else; an operator reads everything and writes nothing.
func TestEachNodeReadsOnlyItsOwn(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	serveAs(ctx, t, s)
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	last := writeRecordsOf(ctx, t, ace, novox)

	t.Run("ace reads its own", func(t *testing.T) { t.Parallel(); readsItsOwn(ctx, t, ace, last) })
	t.Run("ace reads nothing of novox's", func(t *testing.T) { t.Parallel(); tryToRead(t, ace) })

	t.Run("pg reads its provisions and nothing else", func(t *testing.T) {
		t.Parallel()
		pg := connectAs(t, s, wire.RoleProvider, "pg")
		answer, err := client.New(pg.nc).Provisions(ctx, &provisionerv1.ProvisionsRequest{Provider: "pg", MinRevisions: &provisionerv1.Revisions{Needs: last}})
		if err != nil || len(answer.GetProvisions()) != 2 {
			t.Fatalf("pg's provisions: %v, %v; want one of each node", answer, err)
		}
		for _, subject := range []string{wire.ProvisioningSubject, wire.ComposeSubject, wire.NodeSubject(wire.ComposeSubject, "ace"),
			wire.NodeSubject(wire.ProvisioningSubject, "novox"), wire.ProviderSubject("redis"), "$JS.API.STREAM.INFO.KV_mesh-provisioner_needs",
			"$JS.API.DIRECT.GET.KV_mesh-provisioner_needs"} {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := pg.nc.RequestWithContext(ctx, subject, []byte(`{"node":"ace"}`))
			cancel()
			if err == nil || !pg.violated(subject) {
				t.Errorf("pg asked %s: %v, want a permission violation", subject, err)
			}
		}
	})

	t.Run("an operator reads everything and writes nothing", func(t *testing.T) {
		t.Parallel()
		url := "nats://ops:ops-secret@" + strings.TrimPrefix(s.ClientURL(), "nats://")
		as := []string{"--nats-url", url, "--inbox-prefix", wire.InboxPrefix(wire.RoleOperator, "ops")}
		for _, args := range [][]string{
			{"query", "needs", "--json"},
			{"query", "compose", "--node", "novox", "--json"},
			{"query", "applied", "--node", "ace"},
			{"status", "--json"},
			{"capture", "--out", filepath.Join(t.TempDir(), "capture.pb")},
		} {
			var out, errOut bytes.Buffer
			if err := run(ctx, append(args, as...), &out, &errOut); err != nil {
				t.Errorf("%v as ops: %v\n%s", args, err, errOut.String())
			}
			if args[1] == "needs" {
				var answer provisionerv1.ProvisioningResponse
				if err := protojson.Unmarshal(out.Bytes(), &answer); err != nil || len(answer.GetNeeds()) != 4 {
					t.Errorf("every node's needs as ops: %d, %v; want 4", len(answer.GetNeeds()), err)
				}
			}
		}
		ops := connectAs(t, s, wire.RoleOperator, "ops")
		for _, subject := range []string{wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"), wire.KVSubject(keys.RegistryBucket, "port"), wire.SeatSubject, "$JS.API.STREAM.PURGE.KV_mesh-provisioner_needs"} {
			if err := ops.nc.Publish(subject, nil); err != nil {
				t.Fatal(err)
			}
			if !ops.violated(subject) {
				t.Errorf("ops published to %s with no permission violation", subject)
			}
		}
	})
}

// TestEachNodeReadsOnlyItsOwnAcrossAccounts is the same for nodes in their
// accounts of the runs-as set-up, each of which imports its node's own
// subjects only.
func TestEachNodeReadsOnlyItsOwnAcrossAccounts(t *testing.T) {
	t.Parallel()
	s := runsAsServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	t.Cleanup(cancel)
	serveAs(ctx, t, s)
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	last := writeRecordsOf(ctx, t, ace, novox)
	t.Run("ace reads its own", func(t *testing.T) { t.Parallel(); readsItsOwn(ctx, t, ace, last) })
	t.Run("ace reads nothing of novox's", func(t *testing.T) { t.Parallel(); tryToRead(t, ace) })
}

// runsAsServer starts a nats-server whose accounts are what `permissions
// --runs-as ace,novox` prints, each user's password "<user>-secret", with
// an unrestricted user in PROVISIONER (admin) and one in ace's account
// (aceadmin), which is given JetStream: a stream there shows that no answer
// aimed into the asker's own account is stored either.
func runsAsServer(t *testing.T) *server.Server {
	t.Helper()
	return runsAsPartitionedServer(t, 0)
}

// runsAsPartitionedServer is runsAsServer for a mesh of n partitions
// (none below 2): each account imports its verbs from their partition's
// subjects.
func runsAsPartitionedServer(t *testing.T, n int) *server.Server {
	t.Helper()
	config := printed(t, "--runs-as", "ace,novox", "--partitions", strconv.Itoa(n))
	config = regexp.MustCompile(`user: "([^"]+)", password: \$[A-Z0-9_]+`).ReplaceAllString(config, `user: "$1", password: "$1-secret"`)
	config = strings.Replace(config, "users = [\n", "users = [\n      { user: \"admin\", password: \"admin-secret\" }\n", 1)
	aceAccount := `"` + permissions.AccountOf(wire.RoleNode, "ace") + `" {`
	config = strings.Replace(config, aceAccount+"\n    users = [\n",
		aceAccount+"\n    jetstream: enabled\n    users = [\n      { user: \"aceadmin\", password: \"aceadmin-secret\" }\n", 1)
	return natstest.StartWithConfig(t, config)
}

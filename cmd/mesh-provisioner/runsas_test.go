package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// TestRunsAsOnARealServer proves the runs-as set-up: a nats-server whose
// accounts are exactly what `permissions --runs-as` prints. The server's
// identity lives in PROVISIONER, owns the buckets, holds the seat and
// serves; nodes in MESH write their own keys and ask both verbs through the
// imports, and nothing else of PROVISIONER is within reach of MESH, not even
// for a MESH user without any permission restriction.
func TestRunsAsOnARealServer(t *testing.T) {
	t.Parallel()
	s := runsAsServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)

	// The server's identity creates the buckets in its account, takes the
	// seat, reconciles the registry and serves.
	p := startProvisioner(ctx, t, s)
	stopSeat := p.stopSeat

	// Nodes in MESH write their own state through the imports.
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	var needsRevision uint64 // of the last need written
	for _, id := range []*identity{ace, novox} {
		nc, err := nodeclient.New(ctx, nodeclient.Config{Conn: id.nc, Node: id.name})
		if err != nil {
			t.Fatalf("%s binds the state buckets across accounts: %v (violations %v)", id.name, err, id.violations)
		}
		rev, err := nc.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatalf("%s puts its need: %v", id.name, err)
		}
		needsRevision = max(needsRevision, rev)
		if _, err := nc.PutApplied(ctx, "web", &provisionerv1.Applied{PlanDigest: "sha256:" + id.name}); err != nil {
			t.Fatalf("%s puts its applied record: %v", id.name, err)
		}
		if _, err := nc.PutCollectItem(ctx, "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "export A=1"}); err != nil {
			t.Fatalf("%s puts its collection item: %v", id.name, err)
		}
		if _, err := nc.DeleteCollectItem(ctx, "shell:zsh:normal", "web"); err != nil {
			t.Fatalf("%s deletes its collection item: %v", id.name, err)
		}
	}

	// ace asks both verbs, across the accounts, and sees the registry the
	// server's seat wrote and its own writes, asked with the revision of
	// the last need written (read your writes).
	answer, err := client.New(ace.nc, client.AsNode("ace")).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: needsRevision})
	if err != nil {
		t.Fatalf("ace asks the provisioning verb: %v (violations %v)", err, ace.violations)
	}
	if len(answer.GetNeeds()) != 1 {
		t.Fatalf("ace's needs through the verb: %v", answer)
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		answer, err := client.New(ace.nc, client.AsNode("ace")).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_REGISTRY})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(answer.GetRegistry()), len(registry.Table()); got != want {
			return fmt.Errorf("the registry through the verb has %d entries, want %d", got, want)
		}
		return nil
	})
	plan, err := client.New(ace.nc, client.AsNode("ace")).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"})
	if err != nil {
		t.Fatalf("ace asks the compose verb: %v", err)
	}
	if plan == nil {
		t.Fatal("no plan")
	}

	// ace's write with its answer aimed at novox's inbox. The service sees
	// only nats-server's _R_.<token> and answers it; nats-server delivers
	// the answer in ace's own account, where novox is not: the write is
	// ace's own, and its answer reaches no other identity.
	aceadmin := connectAs(t, s, "", "aceadmin")
	stolen := wire.InboxPrefix(wire.RoleNode, "novox") + ".stolen"
	heardByNovox, err := novox.nc.SubscribeSync(wire.InboxPrefix(wire.RoleNode, "novox") + ".>")
	if err != nil {
		t.Fatal(err)
	}
	deliveredInAces, err := aceadmin.nc.SubscribeSync(stolen)
	if err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{novox.nc, aceadmin.nc} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	need, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:stolen}"})
	put, _ := proto.Marshal(&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: "ace.web.port.stolen", Value: need}})
	if err := ace.nc.PublishRequest(wire.NodeSubject(wire.PutSubject, "ace"), stolen, put); err != nil {
		t.Fatal(err)
	}
	if _, err := deliveredInAces.NextMsg(5 * time.Second); err != nil {
		t.Fatalf("the answer to ace's write, aimed at %s, was not delivered in ace's account: %v", stolen, err)
	}
	if err := novox.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if msg, err := heardByNovox.NextMsg(100 * time.Millisecond); err == nil {
		t.Errorf("novox heard %s, the answer to ace's write", msg.Subject)
	}

	// The seat is handed back so that the streams hold still below.
	stopSeat()
	admin := connectAs(t, s, "", "admin")
	baseline := snapshot(t, admin.js)
	if _, ok := baseline[wire.StreamOf(keys.NeedsBucket)]; !ok || len(baseline) != len(keys.Buckets())+1 {
		t.Fatalf("streams of PROVISIONER: %v, want the %d buckets and the plans", baseline, len(keys.Buckets()))
	}
	if names := snapshot(t, aceadmin.js); len(names) != 0 {
		t.Fatalf("MESH sees streams %v of its own", names)
	}

	publish := func(id *identity, subject string, header nats.Header) func(context.Context) error {
		return func(ctx context.Context) error {
			msg := &nats.Msg{Subject: subject, Header: header, Data: []byte("x")}
			reply, err := id.nc.RequestMsgWithContext(ctx, msg)
			if err == nil && strings.Contains(string(reply.Data), `"error"`) {
				return errors.New(string(reply.Data)) // refused by JetStream
			}
			return err
		}
	}
	rollup := nats.Header{"Nats-Rollup": []string{"all"}}
	type outcome int
	const (
		permissionViolation outcome = iota // the user's permissions refuse it
		noResponders                       // MESH has no such subject: nothing of PROVISIONER is reached
		refusedByJetStream                 // reached the stream, which refuses it
	)
	novoxNeed := wire.RunsAsAPIPrefix + ".$KV.mesh-provisioner_needs.novox.web.port.http"
	registryEntry := wire.RunsAsAPIPrefix + ".$KV.mesh-provisioner_registry.port"
	purgeNeeds := wire.RunsAsAPIPrefix + ".STREAM.PURGE.KV_mesh-provisioner_needs"
	aceNeed := wire.RunsAsAPIPrefix + ".$KV.mesh-provisioner_needs.ace.web.port.http"
	needsInfo := wire.RunsAsAPIPrefix + ".STREAM.INFO.KV_mesh-provisioner_needs"
	acePlanGet := wire.RunsAsAPIPrefix + ".DIRECT.GET.KV_mesh-provisioner_plans." + wire.KVSubject(keys.PlansBucket, "ace")
	tests := []struct {
		who     *identity
		action  string
		attempt func(context.Context) error
		want    outcome
		subject string // of the violation
	}{
		{ace, "put novox's need", publish(ace, novoxNeed, nil), permissionViolation, novoxNeed},
		{ace, "put a registry entry", publish(ace, registryEntry, nil), permissionViolation, registryEntry},
		{ace, "take the seat", publish(ace, wire.SeatSubject, nil), permissionViolation, wire.SeatSubject},
		{ace, "take a partition's seat", publish(ace, wire.PartitionSeatSubject(0), nil), permissionViolation, wire.PartitionSeatSubject(0)},
		{ace, "purge the needs through the provisioner's API", publish(ace, purgeNeeds, nil), permissionViolation, purgeNeeds},
		{ace, "roll up the needs on its own key", publish(ace, aceNeed, rollup), permissionViolation, aceNeed},
		{ace, "list the needs' keys through STREAM.INFO", publish(ace, needsInfo, nil), permissionViolation, needsInfo},
		{ace, "get its own plan, the answer aimed anywhere", publish(ace, acePlanGet, nil), permissionViolation, acePlanGet},
		{ace, "declare the manifest of a provider its grant does not name", publish(ace, wire.DeclareSubjectOf("ace", "postgres"), nil), permissionViolation, wire.DeclareSubjectOf("ace", "postgres")},
		{aceadmin, "put its own need under the prefix", publish(aceadmin, aceNeed, nil), noResponders, ""},
		{aceadmin, "list the needs' keys through STREAM.INFO", publish(aceadmin, needsInfo, nil), noResponders, ""},
		{aceadmin, "get a plan under the prefix", publish(aceadmin, acePlanGet, nil), noResponders, ""},
		{aceadmin, "put a registry entry", publish(aceadmin, wire.KVSubject(keys.RegistryBucket, "port"), nil), noResponders, ""},
		{aceadmin, "put a registry entry under the prefix", publish(aceadmin, registryEntry, nil), noResponders, ""},
		{aceadmin, "take the seat", publish(aceadmin, wire.SeatSubject, nil), noResponders, ""},
		{aceadmin, "take a partition's seat", publish(aceadmin, wire.PartitionSeatSubject(0), nil), noResponders, ""},
		{aceadmin, "purge the needs under the prefix", publish(aceadmin, purgeNeeds, nil), noResponders, ""},
		{aceadmin, "create a consumer on the needs under the prefix", publish(aceadmin, wire.RunsAsAPIPrefix+".CONSUMER.CREATE.KV_mesh-provisioner_needs", nil), noResponders, ""},
		{aceadmin, "delete the needs stream", func(ctx context.Context) error { return aceadmin.js.DeleteStream(ctx, "KV_mesh-provisioner_needs") }, refusedByJetStream, ""},
	}
	for _, tt := range tests {
		t.Run(tt.who.name+" may not "+tt.action, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			defer cancel()
			err := tt.attempt(ctx)
			switch tt.want {
			case permissionViolation:
				if err == nil {
					t.Fatal("the attempt succeeded")
				}
				if !tt.who.violated(tt.subject) {
					t.Errorf("no permission violation for %s (the attempt failed with %v)", tt.subject, err)
				}
			case noResponders:
				if !errors.Is(err, nats.ErrNoResponders) && !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Errorf("error %v, want no responders: MESH reaches nothing there", err)
				}
			case refusedByJetStream:
				if err == nil {
					t.Fatal("the attempt succeeded")
				}
				if !strings.Contains(err.Error(), "rollup not permitted") && !errors.Is(err, jetstream.ErrStreamNotFound) {
					t.Errorf("error %v, want the stream to refuse it", err)
				}
			}
			if diff := cmp.Diff(baseline, snapshot(t, admin.js)); diff != "" {
				t.Errorf("the streams changed (-before +after):\n%s", diff)
			}
		})
	}
}

// In the runs-as set-up, node ace in MESH watches its own plan through the
// imports, as in one account (TestANodeWatchesItsPlanOnARealServer), and
// cannot hear, read or forge novox's.
func TestANodeWatchesItsPlanRunsAs(t *testing.T) {
	t.Parallel()
	s := runsAsServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	// The instance writes each node's plan digest while it holds the seat.
	startProvisioner(ctx, t, s)

	ace := connectAs(t, s, wire.RoleNode, "ace")
	aceNode, err := nodeclient.New(ctx, nodeclient.Config{Conn: ace.nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	written, err := aceNode.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	aceClient := client.New(ace.nc, client.AsNode("ace"), client.WithAPIPrefix(wire.RunsAsAPIPrefix))
	if _, err := aceClient.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: written}}); err != nil {
		t.Fatalf("ace composes at its need's revision: %v (violations %v)", err, ace.violations)
	}
	watch := startWatch(t, aceClient, "ace")
	first := watch.next(t, 10*time.Second, "the current plan")
	if len(first.GetPlans()) != 1 || first.GetPlanDigest() == "" {
		t.Fatalf("the first composition: %v", first)
	}
	rev, err := aceNode.PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"})
	if err != nil {
		t.Fatal(err)
	}
	changed := watch.next(t, 10*time.Second, "after a need written")
	if changed.GetRevisions().GetNeeds() < rev || changed.GetPlanDigest() == first.GetPlanDigest() {
		t.Errorf("after the need written at revision %d: %v", rev, changed)
	}
	ace.mu.Lock()
	if len(ace.violations) > 0 {
		t.Errorf("ace's watch of its own plan: permission violations %v", ace.violations)
	}
	ace.mu.Unlock()
	watch.end(t)

	// The command line alike: query compose --watch with --api-prefix,
	// and put, as ace.
	aceArgs := []string{
		"--nats-url", "nats://ace:ace-secret@" + strings.TrimPrefix(s.ClientURL(), "nats://"),
		"--inbox-prefix", wire.InboxPrefix(wire.RoleNode, "ace"),
	}
	watchCmd := startWatchCommand(ctx, t, "ace", append(aceArgs, "--api-prefix", wire.RunsAsAPIPrefix)...)
	watchCmd.printed(t, 1)
	if err := run(ctx, append([]string{"put", "need", "--node", "ace", "--module", "web", "--placeholder", "${port:metrics}"}, aceArgs...), &bytes.Buffer{}, &bytes.Buffer{}); err != nil {
		t.Fatalf("put need: %v", err)
	}
	watchCmd.printed(t, 2)
	watchCmd.end(t)

	// Nor novox's key: neither hear its writes nor read it; nor publish on
	// it, where novox's watch would hear it.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	err = aceClient.WatchPlan(short, "novox", func(*provisionerv1.ComposeResponse) error { return errors.New("delivered") })
	if err == nil {
		t.Error("ace watched novox's plan")
	}
	novox := wire.RunsAsAPIPrefix + "." + wire.KVSubject(keys.PlansBucket, "novox")
	if !ace.refused("Subscription", novox) {
		t.Errorf("no permission violation for ace's subscription to novox's key: %v (%v)", ace.violations, err)
	}
	if wire.CodeOf(err) != wire.CodeForbidden {
		t.Errorf("ace's composition of novox's plan: %v, want a 403", err)
	}
	if err := ace.nc.Publish(novox, []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !ace.violated(novox) {
		t.Errorf("no permission violation for ace's message on novox's key: %v", ace.violations)
	}
}

// In the runs-as layout, a mesh's partitions travel through the imports:
// each node's account imports its verbs from its own partition's subjects,
// so that a node is answered as before, and a node that floods shuts out
// its own partition alone: the other node is answered meanwhile.
func TestPartitionsRunsAs(t *testing.T) {
	t.Parallel()
	const partitions = 8
	s := runsAsPartitionedServer(t, partitions)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)
	p := startProvisioner(ctx, t, s, func(c *service.Config) { c.Partitions, c.MaxRatePerAsker = partitions, 200 })
	if wire.PartitionOf("ace", partitions) == wire.PartitionOf("novox", partitions) {
		t.Fatal("ace and novox share a partition: choose another count")
	}
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	for _, id := range []*identity{ace, novox} {
		nc, err := nodeclient.New(ctx, nodeclient.Config{Conn: id.nc, Node: id.name})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := nc.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}); err != nil {
			t.Fatalf("%s puts its need through its partition's import: %v (violations %v)", id.name, err, id.violations)
		}
		if _, err := client.New(id.nc, client.AsNode(id.name)).Compose(ctx, &provisionerv1.ComposeRequest{Node: id.name}); err != nil {
			t.Fatalf("%s asks its compose through its partition's import: %v", id.name, err)
		}
	}

	body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: "ace"})
	for range 5_000 {
		if err := ace.nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), wire.InboxPrefix(wire.RoleNode, "ace")+".gone", body); err != nil {
			t.Fatal(err)
		}
	}
	if err := ace.nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 10*time.Second, func() error {
		for _, e := range p.inst.Service().Stats().Endpoints {
			data, _ := wire.DecodeStatsData(e.Data)
			for _, x := range data.GetShutOut() {
				if x.GetPartition() == uint32(wire.PartitionOf("ace", partitions)) && x.GetAsker() == "ace" {
					return nil
				}
			}
		}
		return errors.New("ace's partition is not shut out")
	})
	asker := client.New(novox.nc, client.AsNode("novox"))
	for i := range 20 {
		if _, err := asker.Compose(ctx, &provisionerv1.ComposeRequest{Node: "novox"}); err != nil {
			t.Fatalf("novox's compose %d while ace's partition is shut out: %v", i, err)
		}
	}
}

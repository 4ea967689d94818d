package service_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// Two instances that serve two partitions each of a mesh of four serve it
// together: each holds its partitions' nodes alone, the nodes' writes reach
// their partition's holder, and an operator's request about any node, a
// provider's provisions and a listing of every node's needs, whichever
// instance takes them, are answered whole (handed to the holder of the
// partition they read), paging across both instances.
func TestInstancesThatHoldSomePartitionsServeTheMeshTogether(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	const partitions = 4
	server := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, server)
	holding := func(hold ...int) func(*service.Config) {
		return func(c *service.Config) { c.Partitions, c.Hold = partitions, hold }
	}
	low := servicetest.Start(t, natstest.Connect(t, server), holding(0, 1))
	high := servicetest.Start(t, natstest.Connect(t, server), holding(2, 3))

	// Two nodes of each partition, each with a port and a database of
	// postgres's.
	var nodes []string
	count := map[int]int{}
	for i := 0; len(nodes) < 2*partitions; i++ {
		name := fmt.Sprintf("n%d", i)
		if p := wire.PartitionOf(name, partitions); count[p] < 2 {
			count[p]++
			nodes = append(nodes, name)
		}
	}
	slices.Sort(nodes)
	var last uint64
	for _, node := range nodes {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		for _, need := range []struct {
			kind, name string
			need       *provisionerv1.Need
		}{
			{"port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}},
			{"bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "postgres", Provision: "database", Local: "web"}},
		} {
			rev, err := c.PutNeed(ctx, "web", need.kind, need.name, need.need)
			if err != nil {
				t.Fatalf("%s's need, through its partition's holder: %v", node, err)
			}
			last = max(last, rev)
		}
	}
	least := &provisionerv1.Revisions{Needs: last}

	// Each holds its partitions' nodes alone.
	for _, svc := range []*service.Service{low, high} {
		natstest.CheckFor(t, 5*time.Second, func() error {
			for _, b := range statsData(t, svc).GetBuckets() {
				if b.GetBucket() == keys.NeedsBucket && (b.GetNodes() != 4 || b.GetRevision() < last) {
					return fmt.Errorf("instance of %v: the copy of needs holds %d nodes at revision %d, want 4 at %d", svc.Held(), b.GetNodes(), b.GetRevision(), last)
				}
			}
			return nil
		})
	}

	operator := client.New(nc)
	for _, node := range nodes {
		for range 4 { // either instance takes it
			plan, err := operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: least})
			if err != nil {
				t.Fatalf("an operator's compose of %s: %v", node, err)
			}
			if len(plan.GetProvisions()) != 1 || len(plan.GetPlans()) != 1 {
				t.Fatalf("an operator's compose of %s: %d provisions and %d plans, want 1 each: %v", node, len(plan.GetProvisions()), len(plan.GetPlans()), plan)
			}
		}
	}

	// Each partition holds two of postgres's provisions.
	for _, size := range []uint32{1, 2, 3} {
		var provisioned []string
		for page, err := range operator.ProvisionsPages(ctx, &provisionerv1.ProvisionsRequest{Provider: "postgres", MinRevisions: least, PageSize: size}) {
			if err != nil {
				t.Fatalf("postgres's provisions: %v", err)
			}
			for _, p := range page.GetProvisions() {
				provisioned = append(provisioned, p.GetNode())
			}
		}
		slices.Sort(provisioned)
		if diff := cmp.Diff(nodes, provisioned); diff != "" {
			t.Errorf("postgres's provisions' nodes, %d a page (-want +got):\n%s", size, diff)
		}
	}

	var want []string
	for _, node := range nodes {
		want = append(want, node+".bound", node+".port")
	}
	// Each partition holds four needs: pages of four fill at its end.
	for _, size := range []uint32{1, 3, 4, 5} {
		var listed []string
		for page, err := range operator.ProvisioningPages(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last, PageSize: size}) {
			if err != nil {
				t.Fatalf("every node's needs: %v", err)
			}
			for _, n := range page.GetNeeds() {
				listed = append(listed, n.GetNode()+"."+n.GetKind())
			}
		}
		slices.Sort(listed)
		if diff := cmp.Diff(want, listed); diff != "" {
			t.Errorf("every node's needs, %d a page (-want +got):\n%s", size, diff)
		}
	}

	relayed := 0
	for _, svc := range []*service.Service{low, high} {
		for _, e := range svc.Stats().Endpoints {
			data, _ := wire.DecodeStatsData(e.Data)
			relayed += int(data.GetRelayed())
		}
	}
	if relayed == 0 {
		t.Error("no request was handed on: each instance answered what it does not hold")
	}
}

// statsData returns an endpoint's data of svc's stats.
func statsData(t *testing.T, svc *service.Service) *provisionerv1.EndpointStatsData {
	t.Helper()
	for _, e := range svc.Stats().Endpoints {
		if e.Name == wire.ComposeEndpoint {
			data, err := wire.DecodeStatsData(e.Data)
			if err != nil {
				t.Fatal(err)
			}
			return data
		}
	}
	t.Fatal("no compose endpoint")
	return nil
}

// nodesOf returns the first n node names, n0, n1 and on, of partition p of
// a mesh of partitions.
func nodesOf(p, partitions, n int) []string {
	var nodes []string
	for i := 0; len(nodes) < n; i++ {
		if name := fmt.Sprintf("n%d", i); wire.PartitionOf(name, partitions) == p {
			nodes = append(nodes, name)
		}
	}
	return nodes
}

// relayingPartitions is how many partitions the mesh of startRelaying has.
const relayingPartitions = 4

// startRelaying starts a nats-server that maps relayingPartitions
// partitions, and on it a service that serves partitions 0 and 1, further
// configured by options: it hands on the requests about nodes of 2 and 3.
func startRelaying(t *testing.T, options ...func(*service.Config)) (*server.Server, *nats.Conn, *service.Service) {
	t.Helper()
	srv := natstest.StartWithConfig(t, permissions.MappingsConfig(relayingPartitions))
	nc := natstest.Connect(t, srv)
	holds := func(c *service.Config) { c.Partitions, c.Hold = relayingPartitions, []int{0, 1} }
	return srv, nc, servicetest.Start(t, nc, append([]func(*service.Config){holds}, options...)...)
}

// A request about a partition no instance serves is a 503 that says so,
// at once, not a request left to time out.
func TestARequestAboutAPartitionNobodyServesIsA503(t *testing.T) {
	t.Parallel()
	_, nc, _ := startRelaying(t)
	node := nodesOf(2, relayingPartitions, 1)[0]
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: node})
	if wire.CodeOf(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "no instance serves it now") {
		t.Errorf("an operator's compose of %s, of partition 2, which nobody serves: %v; want a 503 saying so", node, err)
	}
}

// A request handed on waits for the holder's answer as one waiting for
// revisions does: past MaxWaiting of them at once, a 503 that says so.
func TestRequestsHandedOnAreBounded(t *testing.T) {
	t.Parallel()
	_, nc, svc := startRelaying(t, func(c *service.Config) { c.MaxWaiting = 1 })
	// A holder of partition 2 that never answers.
	silent, err := nc.Subscribe(wire.RelaySubject(2, wire.ComposeSubject), func(*nats.Msg) {})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = silent.Unsubscribe() }()
	of2 := nodesOf(2, relayingPartitions, 2)
	operator := client.New(nc)
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
		defer cancel()
		_, err := operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: of2[0]})
		first <- err
	}()
	natstest.CheckFor(t, 2*time.Second, func() error {
		if data := statsData(t, svc); data.GetRelayed() == 0 {
			return errors.New("the first request is not handed on yet")
		}
		return nil
	})
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
	defer cancel()
	_, err = operator.Compose(ctx, &provisionerv1.ComposeRequest{Node: of2[1]})
	if wire.CodeOf(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "already wait") {
		t.Errorf("a second request handed on while the first waits, MaxWaiting 1: %v; want a 503 saying so", err)
	}
	if err := <-first; err == nil {
		t.Error("the first request, to a holder that never answers, was answered")
	}
}

// A request handed to a holder that dies with it in hand is handed on once
// more, a second after, to the holder nats-server sends it to then: its
// asker is answered, rather than left waiting for relayWait (10 s).
func TestARequestHandedToAHolderThatDiesIsHandedOnAgain(t *testing.T) {
	t.Parallel()
	srv, nc, _ := startRelaying(t)
	node := nodesOf(2, relayingPartitions, 1)[0]
	// Partition 2's first holder takes the request and dies with it:
	// another, which answers, subscribes as it does.
	holders := natstest.Connect(t, srv)
	subject := wire.RelaySubject(2, wire.ComposeSubject)
	answer, _ := proto.Marshal(&provisionerv1.ComposeResponse{Node: node, PlanDigest: "the second holder's"})
	dying, err := holders.Subscribe(subject, func(*nats.Msg) {
		if _, err := holders.Subscribe(subject, func(m *nats.Msg) { _ = m.Respond(answer) }); err != nil {
			t.Error(err)
		}
		if err := holders.Flush(); err != nil { // subscribed before the request comes again
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := dying.AutoUnsubscribe(1); err != nil {
		t.Fatal(err)
	}
	if err := holders.Flush(); err != nil { // subscribed before the request comes
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	got, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: node})
	if err != nil || got.GetPlanDigest() != "the second holder's" {
		t.Errorf("an operator's compose of %s, its first holder dead with it: %v, %v; want the second holder's answer within 3 s", node, got, err)
	}
}

// A request another instance handed on is never handed on again, with the
// service observed (serve --http) as without: instances that disagree on
// who holds what would otherwise pass it round.
func TestARequestHandedOnIsNotHandedOnAgain(t *testing.T) {
	t.Parallel()
	_, nc, _ := startRelaying(t, func(c *service.Config) { c.Observe = func(string, int, time.Duration) {} })
	node := nodesOf(2, relayingPartitions, 1)[0]
	// As another instance would hand it on, on its own inbox, but to a
	// holder of partition 0 for a node of partition 2.
	inbox := wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity) + ".test"
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: node})
	msg := &nats.Msg{Subject: wire.RelaySubject(0, wire.ComposeSubject), Reply: inbox, Data: body, Header: nats.Header{"Content-Type": {wire.ContentTypeProtobuf}}}
	if err := nc.PublishMsg(msg); err != nil {
		t.Fatal(err)
	}
	answer, err := sub.NextMsg(2 * time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.ErrorOf(answer); wire.CodeOf(err) != wire.CodeUnavailable || !strings.Contains(err.Error(), "does not serve partition 2") {
		t.Errorf("a compose of %s, of partition 2, handed to partition 0's holder: %v; want the 503 of a request not handed on again", node, err)
	}
}

// A page token of a walk of every node made one way (in key order across
// the mesh) is refused by an instance that walks the other (partition by
// partition): read as its own, it would skip or repeat records.
func TestAWalksTokenIsRefusedByAnInstanceThatWalksOtherwise(t *testing.T) {
	t.Parallel()
	const partitions = 4
	server := natstest.StartWithConfig(t, permissions.MappingsConfig(partitions))
	nc := natstest.Connect(t, server)
	whole := servicetest.Start(t, natstest.Connect(t, server), func(c *service.Config) { c.Partitions = partitions })
	ctx := t.Context()
	var last uint64
	for _, node := range []string{"n0", "n1", "n2"} {
		c, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		revision, err := c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		last = max(last, revision)
	}
	operator := client.New(nc)
	// At the last write's revision: the copy may not hold the writes yet.
	first, err := operator.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last, PageSize: 1})
	if err != nil || first.GetNextPageToken() == "" {
		t.Fatalf("the first page: %v, %v; want one need and a token", first, err)
	}
	whole.Stop()
	servicetest.Start(t, natstest.Connect(t, server), func(c *service.Config) { c.Partitions, c.Hold = partitions, []int{0, 1, 2, 3} })
	_, err = operator.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, PageSize: 1, PageToken: first.GetNextPageToken()})
	if wire.CodeOf(err) != wire.CodeBadRequest || !strings.Contains(err.Error(), "walks the mesh otherwise") {
		t.Errorf("the whole mesh's token, to an instance that walks by partition: %v; want a 400 saying so", err)
	}
}

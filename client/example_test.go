package client_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// Node ace connects with its own inbox prefix, writes its needs through
// package nodeclient, then reads them page by page and composes its plan
// on its own subjects (client.AsNode); another node's plan is refused.
func Example() {
	url, stop := startService() // a nats-server and the service, in this process
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	nc, err := nats.Connect(url, client.Inbox(wire.RoleNode, "ace"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()

	// Writes go through the service's write verbs (package nodeclient).
	writer, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		panic(err)
	}
	applied, err := writer.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{
		{Kind: "port", Name: "http", Need: &provisionerv1.Need{Placeholder: "${port:http}", Required: true}},
		{Kind: "dir", Name: "state", Need: &provisionerv1.Need{Placeholder: "${dir:state}"}},
	})
	if err != nil {
		panic(err)
	}

	c := client.New(nc, client.AsNode("ace"))
	// MinRevision: answered once the service's copy holds the write.
	pages := c.ProvisioningPages(ctx, &provisionerv1.ProvisioningRequest{
		What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: applied.GetRevision(), PageSize: 1,
	})
	n := 0
	for page, err := range pages {
		if err != nil {
			panic(err)
		}
		n++
		for _, need := range page.GetNeeds() {
			fmt.Printf("page %d: %s %s\n", n, need.GetModule(), need.GetNeed().GetPlaceholder())
		}
	}

	plan, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{
		Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: applied.GetRevision()},
	})
	if err != nil {
		panic(err)
	}
	for _, module := range plan.GetPlans() {
		for _, item := range module.GetItems() {
			where := item.GetBucket()
			fmt.Printf("plan: %s %s from %s, key %s of %s\n",
				module.GetModule(), item.GetPlaceholder(), item.GetOwner(), where.GetKey(), where.GetBucket())
		}
	}

	_, err = c.Compose(ctx, &provisionerv1.ComposeRequest{Node: "novox"})
	fmt.Println("novox's plan:", wire.CodeOf(err))
	// Output:
	// page 1: web ${dir:state}
	// page 2: web ${port:http}
	// plan: web ${dir:state} from mesh-controller, key ace.web of mesh-controller_assignments
	// plan: web ${port:http} from mesh-controller, key ace.web of mesh-controller_assignments
	// novox's plan: 403
}

// Node ace watches its plan: the composition as it is, then again each
// time the plan's digest moves, here after a need written.
func ExampleClient_WatchPlan() {
	url, stop := startService()
	defer stop()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(url, client.Inbox(wire.RoleNode, "ace"))
	if err != nil {
		panic(err)
	}
	defer nc.Close()
	writer, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		panic(err)
	}

	plans := 0
	err = client.New(nc, client.AsNode("ace")).WatchPlan(ctx, "ace", func(plan *provisionerv1.ComposeResponse) error {
		plans++
		var placeholders []string
		for _, module := range plan.GetPlans() {
			for _, item := range module.GetItems() {
				placeholders = append(placeholders, item.GetPlaceholder())
			}
		}
		fmt.Println("plan", plans, placeholders)
		if plans == 1 {
			_, err := writer.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
			return err
		}
		cancel() // enough: WatchPlan returns nil
		return nil
	})
	fmt.Println("watch:", err)
	// Output:
	// plan 1 []
	// plan 2 [${port:http}]
	// watch: <nil>
}

// README.md's example is Example's code as this file has it.
func TestREADMEShowsExample(t *testing.T) {
	t.Parallel()
	src, err := os.ReadFile("example_test.go")
	if err != nil {
		t.Fatal(err)
	}
	start := bytes.Index(src, []byte("\nfunc Example() {\n"))
	end := bytes.Index(src[start+1:], []byte("\n}\n"))
	if start < 0 || end < 0 {
		t.Fatal("no func Example in example_test.go")
	}
	example := src[start+1 : start+1+end+3]
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Contains(readme, example) {
		t.Errorf("README.md does not show Example as example_test.go has it; its code is:\n%s", example)
	}
}

// startService runs, in this process, what a node's client talks to: a
// nats-server with JetStream on a free loopback port (no authorization),
// and an instance on it (internal/instance, as serve runs it): its buckets
// made, its seat taken, its registry written, the nodes' plan digests kept. It returns the
// server's URL, and stop, which ends both. Tests get the same from
// internal/testkit/natstest and internal/testkit/servicetest, which need a testing.TB.
func startService() (url string, stop func()) {
	dir, err := os.MkdirTemp("", "client-example-")
	if err != nil {
		panic(err)
	}
	ns, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: dir, NoLog: true, NoSigs: true,
	})
	if err != nil {
		panic(err)
	}
	ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		panic("nats-server did not start in 10s")
	}
	nc, err := nats.Connect(ns.ClientURL())
	if err != nil {
		panic(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	inst, err := instance.Start(ctx, instance.Config{
		Service:       service.Config{Conn: nc, WatchConn: nc, Logger: slog.New(slog.DiscardHandler)},
		PlansInterval: 10 * time.Millisecond,
	})
	if err != nil {
		panic(err)
	}
	runCtx, stopRun := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- inst.Run(runCtx) }()
	select {
	case <-inst.Serving():
	case err := <-runDone:
		panic(fmt.Sprintf("the instance ended before it served: %v", err))
	}
	return ns.ClientURL(), func() {
		stopRun()
		if err := <-runDone; err != nil {
			panic(err)
		}
		nc.Close()
		ns.Shutdown()
		ns.WaitForShutdown()
		_ = os.RemoveAll(dir)
	}
}

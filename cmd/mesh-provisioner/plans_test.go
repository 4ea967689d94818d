package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// On a nats-server whose authorization is what the permissions command
// prints: node ace watches its own plan and gets a new composition when it
// writes a need, none when nothing changed; it cannot watch novox's.
func TestANodeWatchesItsPlanOnARealServer(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	srv := connectAs(t, s, wire.RoleServer, wire.ServerIdentity)
	writer := connectAs(t, s, wire.RoleServer, wire.WriterIdentity)
	svc := servicetest.StartAs(t, srv.nc, writer.nc)
	servicetest.RunPlans(t, svc, writer.nc, 10*time.Millisecond)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	ace := connectAs(t, s, wire.RoleNode, "ace")
	aceClient, err := nodeclient.New(ctx, nodeclient.Config{Conn: ace.nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	written, err := aceClient.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	// The watch's first composition is of the service's copy as it is
	// then: the copy has the need first (a loaded machine's lagged).
	if _, err := client.New(ace.nc, client.AsNode("ace")).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: written}}); err != nil {
		t.Fatalf("ace composes at its need's revision: %v (violations %v)", err, ace.violations)
	}
	watch := startWatch(t, client.New(ace.nc, client.AsNode("ace")), "ace")
	first := watch.next(t, 10*time.Second, "the current plan")
	if len(first.GetPlans()) != 1 || first.GetPlanDigest() == "" {
		t.Fatalf("the first composition: %v", first)
	}
	rev, err := aceClient.PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"})
	if err != nil {
		t.Fatal(err)
	}
	changed := watch.next(t, 10*time.Second, "after a need written")
	if changed.GetRevisions().GetNeeds() < rev || changed.GetPlanDigest() == first.GetPlanDigest() || len(changed.GetPlans()[0].GetItems()) != 2 {
		t.Errorf("after the need written at revision %d: %v", rev, changed)
	}
	// Written again unchanged: the digest holds, nothing is delivered.
	if _, err := aceClient.PutNeed(ctx, "web", "port", "admin", &provisionerv1.Need{Placeholder: "${port:admin}"}); err != nil {
		t.Fatal(err)
	}
	watch.none(t, 300*time.Millisecond, "after an unchanged write")

	// Messages on ace's key that are not writes of it, such as a
	// JetStream answer aimed there (Nats-Stream) or another key's message
	// (Nats-Subject), each with a digest ace's watch has not seen: the
	// watch composes for none of them, whoever sent them.
	admin := connectAs(t, s, "", "admin")
	handled := statsOf(t, admin.nc).handled
	for i := range 40 {
		msg := nats.NewMsg(wire.KVSubject(keys.PlansBucket, "ace"))
		msg.Data, _ = proto.Marshal(&provisionerv1.PlanDigest{Digest: fmt.Sprintf("sha256:forged%d", i), Revisions: &provisionerv1.Revisions{Needs: rev}})
		if i%2 == 0 {
			msg.Header.Set(jetstream.StreamHeader, wire.StreamOf(keys.PlansBucket))
		} else {
			msg.Header.Set(jetstream.SubjectHeader, wire.KVSubject(keys.PlansBucket, "novox"))
		}
		if err := admin.nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	if err := admin.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	watch.none(t, 500*time.Millisecond, "after messages that are not writes of ace's key")
	if n := statsOf(t, admin.nc).handled - handled; n != 0 {
		t.Errorf("the service handled %d requests after 40 messages that are not writes of ace's key: the watch composed for them", n)
	}
	ace.mu.Lock()
	if len(ace.violations) > 0 {
		t.Errorf("ace's watch of its own plan: permission violations %v", ace.violations)
	}
	ace.mu.Unlock()
	watch.end(t)

	// ace cannot write a digest, not even its own.
	if err := ace.nc.Publish(wire.KVSubject(keys.PlansBucket, "ace"), []byte("x")); err != nil {
		t.Fatal(err)
	}
	if !ace.violated(wire.KVSubject(keys.PlansBucket, "ace")) {
		t.Error("ace's write of its plan digest was not refused by nats-server")
	}

	// ace cannot watch novox's key: neither hear its writes nor read it.
	short, cancelShort := context.WithTimeout(ctx, time.Second)
	defer cancelShort()
	err = client.New(ace.nc, client.AsNode("ace")).WatchPlan(short, "novox", func(*provisionerv1.ComposeResponse) error { return errors.New("delivered") })
	if err == nil {
		t.Error("ace watched novox's plan")
	}
	plans := wire.StreamOf(keys.PlansBucket)
	novox := wire.KVSubject(keys.PlansBucket, "novox")
	if !ace.refused("Subscription", novox) {
		t.Errorf("no permission violation for ace's subscription to novox's key: %v (%v)", ace.violations, err)
	}
	if wire.CodeOf(err) != wire.CodeForbidden {
		t.Errorf("ace's composition of novox's plan: %v, want a 403", err)
	}
	// Nor a direct get of any key, its own either: a node publishes
	// nothing into JetStream.
	for _, key := range []string{"novox", "ace"} {
		direct := "$JS.API.DIRECT.GET." + plans + "." + wire.KVSubject(keys.PlansBucket, key)
		if err := ace.nc.Publish(direct, nil); err != nil {
			t.Fatal(err)
		}
		natstest.CheckFor(t, 2*time.Second, func() error {
			if !ace.violated(direct) {
				return fmt.Errorf("no permission violation for ace's direct get of %s's key: %v", key, ace.violations)
			}
			return nil
		})
	}

	before := consumersOf(ctx, t, writer.js, plans) // the writer's watch of every key
	// Nor make a consumer of the plans' stream, even of its own key: one
	// it may make is one more it may make (a durable outlives its
	// connection), until the stream holds no more and every node's watch
	// fails. Nor read a key named in a direct get's body.
	for _, c := range []jetstream.ConsumerConfig{
		{Durable: "greedy", FilterSubject: wire.KVSubject(keys.PlansBucket, "ace")},
		{Name: "greedy", FilterSubject: wire.KVSubject(keys.PlansBucket, "ace"), InactiveThreshold: time.Hour},
	} {
		short, cancelShort := context.WithTimeout(ctx, time.Second)
		_, err := ace.js.CreateConsumer(short, plans, c)
		cancelShort()
		if err == nil {
			t.Errorf("ace made a consumer of %s: %+v", plans, c)
		}
	}
	if !ace.violated("$JS.API.CONSUMER.CREATE." + plans + ".greedy." + wire.KVSubject(keys.PlansBucket, "ace")) {
		t.Errorf("no permission violation for ace's consumer of its own plan: %v", ace.violations)
	}
	if err := ace.nc.PublishRequest("$JS.API.DIRECT.GET."+plans, ace.nc.NewRespInbox(), []byte(`{"last_by_subj":"`+novox+`"}`)); err != nil {
		t.Fatal(err)
	}
	if !ace.violated("$JS.API.DIRECT.GET." + plans) {
		t.Errorf("no permission violation for ace's direct get naming novox's key in its body: %v", ace.violations)
	}
	if after := consumersOf(ctx, t, writer.js, plans); after != before {
		t.Errorf("%s has %d consumers after ace's tries, %d before", plans, after, before)
	}
}

// consumersOf returns how many consumers a stream has.
func consumersOf(ctx context.Context, t *testing.T, js jetstream.JetStream, name string) int {
	t.Helper()
	stream, err := js.Stream(ctx, name)
	if err != nil {
		t.Fatal(err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

// servedWithPlans starts a nats-server, the service on it with its plans
// writer, and node ace's client.
func servedWithPlans(t *testing.T) (*server.Server, *nats.Conn, *nodeclient.Client) {
	t.Helper()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	svc := servicetest.Start(t, nc)
	servicetest.RunPlans(t, svc, nc, 10*time.Millisecond)
	ace, err := nodeclient.New(t.Context(), nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	return s, nc, ace
}

// query compose --watch prints the node's composition, then each new one.
func TestQueryComposeWatch(t *testing.T) {
	t.Parallel()
	s, _, ace := servedWithPlans(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	watch := startWatchCommand(ctx, t, "ace", "--nats-url", s.ClientURL())
	watch.printed(t, 1)
	if _, err := ace.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"}); err != nil {
		t.Fatal(err)
	}
	watch.printed(t, 2)
	if !strings.Contains(watch.out.String(), "mesh-controller_assignments ace.web") {
		t.Errorf("the second composition lacks the need written:\n%s", watch.out.String())
	}
	watch.end(t)
}

// watchCommand is a run of query compose --watch.
type watchCommand struct {
	out  *testlog.Buffer
	stop context.CancelFunc
	done chan error
}

// startWatchCommand runs query compose --node node --watch with args until
// its end.
func startWatchCommand(ctx context.Context, t *testing.T, node string, args ...string) *watchCommand {
	t.Helper()
	watchCtx, stop := context.WithCancel(ctx)
	t.Cleanup(stop)
	w := &watchCommand{out: &testlog.Buffer{}, stop: stop, done: make(chan error, 1)}
	go func() {
		w.done <- run(watchCtx, append([]string{"query", "compose", "--node", node, "--watch"}, args...), w.out, &bytes.Buffer{})
	}()
	return w
}

// printed waits until the command has printed n compositions.
func (w *watchCommand) printed(t *testing.T, n int) {
	t.Helper()
	natstest.CheckFor(t, 10*time.Second, func() error {
		if got := strings.Count(w.out.String(), "plan digest "+compose.DigestPrefix); got < n {
			return fmt.Errorf("%d compositions printed, want %d:\n%s", got, n, w.out.String())
		}
		return nil
	})
}

// end interrupts the command, which ends without an error.
func (w *watchCommand) end(t *testing.T) {
	t.Helper()
	w.stop()
	if err := <-w.done; err != nil {
		t.Errorf("query --watch ended with %v, want nil when interrupted", err)
	}
}

// A watch whose connection was lost while the node's plan changed reads
// the node's key once reconnected, and delivers the change it could not
// hear: nothing was written after it came back.
func TestWatchPlanReadsWhatChangedWhileAway(t *testing.T) {
	t.Parallel()
	s, nc, ace := servedWithPlans(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	proxy := natstest.NewProxy(t, s)
	away, err := nats.Connect(proxy.URL(), nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(away.Close)
	watch := startWatch(t, client.New(away), "ace")
	watch.next(t, 10*time.Second, "the current plan")

	proxy.Cut()
	natstest.CheckFor(t, 5*time.Second, func() error {
		if away.IsConnected() {
			return errors.New("the watch's connection is still up")
		}
		return nil
	})
	written, err := ace.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	plans, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := plans.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() error { // the digest of the need, written while away
		e, err := kv.Get(ctx, "ace")
		if err != nil {
			return err
		}
		digest := &provisionerv1.PlanDigest{}
		if err := proto.Unmarshal(e.Value(), digest); err != nil {
			return err
		}
		if digest.GetRevisions().GetNeeds() < written {
			return fmt.Errorf("ace's digest is of needs at %d, the need is at %d", digest.GetRevisions().GetNeeds(), written)
		}
		return nil
	})
	proxy.Heal()
	c := watch.next(t, 10*time.Second, "after the reconnect (the change made while away, if missed)")
	if c.GetRevisions().GetNeeds() < written || len(c.GetPlans()) != 1 {
		t.Errorf("the composition after the reconnect: %v, want one at needs >= %d with the need's plan", c, written)
	}
	watch.end(t)
}

// A watch that starts before any instance serves (a node up before the
// service) asks its first composition again until one answers: no
// responders is no reason to end it.
func TestWatchPlanWaitsForTheService(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Buckets(t, nc)
	watch := startWatch(t, client.New(nc), "ace")
	watch.none(t, 500*time.Millisecond, "with no instance serving") // its first composition asked, with no responders
	servicetest.Start(t, nc)
	if c := watch.next(t, 10*time.Second, "once an instance serves"); c.GetNode() != "ace" || c.GetPlanDigest() == "" {
		t.Errorf("the first composition: %v", c)
	}
	watch.end(t)
}

// watching is a plan watch a test runs: what it delivers, and how it ended.
type watching struct {
	compositions chan *provisionerv1.ComposeResponse
	stop         context.CancelFunc
	done         chan struct{}
	err          error // once done
}

// startWatch watches node's plan through c with no deadline, as a node
// does, until the test ends or end is called.
func startWatch(t *testing.T, c *client.Client, node string) *watching {
	t.Helper()
	ctx, stop := context.WithCancel(context.Background())
	w := &watching{compositions: make(chan *provisionerv1.ComposeResponse, 16), stop: stop, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		w.err = c.WatchPlan(ctx, node, func(c *provisionerv1.ComposeResponse) error {
			w.compositions <- c
			return nil
		})
	}()
	t.Cleanup(func() {
		stop()
		<-w.done
	})
	return w
}

// next returns the watch's next composition, within d.
func (w *watching) next(t *testing.T, d time.Duration, what string) *provisionerv1.ComposeResponse {
	t.Helper()
	select {
	case c := <-w.compositions:
		return c
	case <-w.done:
		t.Fatalf("%s: the watch ended: %v", what, w.err)
	case <-time.After(d):
		t.Fatalf("%s: no composition within %s", what, d)
	}
	return nil
}

// none fails the test if the watch delivers a composition or ends within d.
func (w *watching) none(t *testing.T, d time.Duration, what string) {
	t.Helper()
	select {
	case c := <-w.compositions:
		t.Fatalf("%s: a composition: %v", what, c)
	case <-w.done:
		t.Fatalf("%s: the watch ended: %v", what, w.err)
	case <-time.After(d):
	}
}

// end stops the watch, which must end with no error.
func (w *watching) end(t *testing.T) {
	t.Helper()
	w.stop()
	<-w.done
	if w.err != nil {
		t.Errorf("the watch ended with %v, want nil on its context's end", w.err)
	}
}

// A node to watch is a token: a wildcard would subscribe to every node's
// key the identity may read.
func TestWatchPlanRefusesANodeThatIsNoToken(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	for _, node := range []string{"*", ">", "ace.web", ""} {
		err := client.New(nc).WatchPlan(t.Context(), node, func(*provisionerv1.ComposeResponse) error { return nil })
		if err == nil || !strings.Contains(err.Error(), "the node") {
			t.Errorf("WatchPlan(%q) = %v, want the node refused", node, err)
		}
	}
}

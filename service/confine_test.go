package service_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// TestNodeAddressedVerbs: on its own subjects a node reads its own records,
// its own plan and the registry; anything of another node, or of every
// node, is a 403 with a sentence, and no answer goes into another node's
// inbox.
func TestNodeAddressedVerbs(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	ace := client.New(m.nc, client.AsNode("ace"))
	if got, want := ace.Subject(), "mesh-provisioner.provisioning.ace"; got != want {
		t.Errorf("subject %s, want %s", got, want)
	}

	allowed := []*provisionerv1.ProvisioningRequest{
		{},
		{What: provisionerv1.What_WHAT_REGISTRY},
		{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"},
		{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", Module: "web"},
		{What: provisionerv1.What_WHAT_APPLIED, Node: "ace"},
		{What: provisionerv1.What_WHAT_COLLECT, Node: "ace", Collection: "shell:zsh:normal"},
	}
	for _, req := range allowed {
		got, err := ace.Provisioning(ctx, req)
		if err != nil {
			t.Fatalf("%v as ace: %v", req, err)
		}
		want := m.ask(t, req)
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("%v on ace's subject differs from the operator's answer (-want +got):\n%s", req, diff)
		}
		for _, r := range append(append(got.GetNeeds(), nil), nil) {
			if r != nil && r.GetNode() != "ace" {
				t.Errorf("ace's answer holds %s's need", r.GetNode())
			}
		}
	}
	if plan, err := ace.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"}); err != nil || plan.GetNode() != "ace" {
		t.Errorf("ace composes its own plan: %v, %v", plan, err)
	}

	forbidden := []struct {
		name string
		ask  func() error
		says string
	}{
		{"novox's needs", func() error {
			_, err := ace.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "novox"})
			return err
		}, `node "ace" reads its own records only, and the request names node "novox"`},
		{"every node's needs", func() error {
			_, err := ace.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS})
			return err
		}, `a node reads its own records only: set node to "ace"`},
		{"every node's applied records", func() error {
			_, err := ace.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED, Module: "web"})
			return err
		}, "WHAT_APPLIED on mesh-provisioner.provisioning.ace"},
		{"novox's collection items", func() error {
			_, err := ace.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_COLLECT, Node: "novox"})
			return err
		}, `the request names node "novox"`},
		{"novox's plan", func() error {
			_, err := ace.Compose(ctx, &provisionerv1.ComposeRequest{Node: "novox"})
			return err
		}, `compose on mesh-provisioner.compose.ace composes node "ace" only, and the request names node "novox"`},
	}
	for _, tt := range forbidden {
		err := tt.ask()
		if wire.CodeOf(err) != wire.CodeForbidden || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%s as ace: %v, want a 403 saying %q", tt.name, err, tt.says)
		}
	}

	// A name the subject cannot carry as a key token, or too long.
	for _, node := range []string{strings.Repeat("n", 300), "a=b=c%"} {
		reply, err := m.nc.Request(wire.NodeSubject(wire.ComposeSubject, node), []byte(`{"node":"`+node+`"}`), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if code := wire.CodeOf(wire.ErrorOf(reply)); code != wire.CodeBadRequest {
			t.Errorf("compose on node %.20q...: code %d, want 400", node, code)
		}
	}

	// An answer on ace's subject goes to no other node's or provider's inbox.
	before := statsOf(t, m.nc)
	for _, reply := range []string{wire.InboxPrefix(wire.RoleNode, "novox") + ".x", wire.InboxPrefix(wire.RoleProvider, "pg") + ".x"} {
		if err := m.nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), reply, []byte(`{"node":"ace"}`)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if got := statsOf(t, m.nc)[wire.ComposeNodeEndpoint] - before[wire.ComposeNodeEndpoint]; got != 2 {
			return errors.New("the two answers aimed at other identities' inboxes are not counted as refused replies")
		}
		return nil
	})
	// Answered into ace's own inbox only: not an operator's, nor nats.go's
	// (issue 37).
	for _, reply := range []string{wire.InboxPrefix(wire.RoleOperator, "ops") + ".x", "_INBOX.x"} {
		if err := m.nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), reply, []byte(`{"node":"ace"}`)); err != nil {
			t.Fatal(err)
		}
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if got := statsOf(t, m.nc)[wire.ComposeNodeEndpoint] - before[wire.ComposeNodeEndpoint]; got != 4 {
			return fmt.Errorf("%d answers aimed at others' inboxes counted as refused replies, want 4", got)
		}
		return nil
	})
	for _, reply := range []string{wire.InboxPrefix(wire.RoleNode, "ace") + ".x"} {
		sub, _ := m.nc.SubscribeSync(reply)
		if err := m.nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), reply, []byte(`{"node":"ace"}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := sub.NextMsg(5 * time.Second); err != nil {
			t.Errorf("an answer to %s: %v", reply, err)
		}
	}
}

// statsOf returns each endpoint's refused_replies.
func statsOf(t *testing.T, nc *nats.Conn) map[string]uint64 { return refusedReplies(t, nc) }

// TestProvisionsVerb: a provider lists what every node's bound needs ask of
// it, each with its node, in key order, the same as the nodes'
// compositions hold; page by page as whole; another provider's is a 403.
func TestProvisionsVerb(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	var last uint64
	for key, need := range map[string]*provisionerv1.Need{
		"ace.web.bound.db":      {Placeholder: "${bound:db}", Provider: "postgres", Provision: "database", Local: "web"},
		"ace.web.port.http":     {Placeholder: "${port:http}"},
		"novox.api.bound.db":    {Placeholder: "${bound:db}", Provider: "postgres", Provision: "database", Local: "api"},
		"novox.api.bound.cache": {Placeholder: "${bound:cache}", Provider: "redis", Provision: "cache", Local: "api"},
		"novox.api.bound.other": {Placeholder: "${bound:other}", Provider: "postgres"}, // provision: its name
	} {
		last = max(last, put(t, needs, key, encode(t, need)))
	}
	c := client.New(nc)
	answer, err := c.Provisions(ctx, &provisionerv1.ProvisionsRequest{Provider: "postgres", MinRevisions: &provisionerv1.Revisions{Needs: last}})
	if err != nil {
		t.Fatal(err)
	}
	// What the nodes' compositions ask of postgres, with their node.
	var want []*provisionerv1.Provision
	for _, node := range []string{"ace", "novox"} {
		plan, err := c.Compose(ctx, &provisionerv1.ComposeRequest{Node: node})
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range plan.GetProvisions() {
			if p.GetProvider() == "postgres" {
				p.Node = node
				want = append(want, p)
			}
		}
	}
	if len(want) != 3 {
		t.Fatalf("the compositions ask postgres %d provisions, want 3: %v", len(want), want)
	}
	if diff := cmp.Diff(want, answer.GetProvisions(), protocmp.Transform()); diff != "" {
		t.Errorf("postgres's provisions (-want +got):\n%s", diff)
	}
	if answer.GetRevisions().GetNeeds() < last || answer.GetProvider() != "postgres" {
		t.Errorf("answer %v, want provider postgres at needs revision >= %d", answer, last)
	}
	var paged []*provisionerv1.Provision
	pages := 0
	for page, err := range c.ProvisionsPages(ctx, &provisionerv1.ProvisionsRequest{Provider: "postgres", PageSize: 1}) {
		if err != nil {
			t.Fatal(err)
		}
		pages++
		paged = append(paged, page.GetProvisions()...)
	}
	if diff := cmp.Diff(want, paged, protocmp.Transform()); diff != "" || pages != 3 {
		t.Errorf("%d pages of one: (-want +got):\n%s", pages, diff)
	}

	// Asked on postgres's subject, redis's provisions are a 403.
	reply, err := wire.Request(ctx, nc, wire.RoleProvider, "postgres", &nats.Msg{Subject: wire.ProviderSubject("postgres"), Data: []byte(`{"provider":"redis"}`)})
	if err != nil {
		t.Fatal(err)
	}
	if err := wire.ErrorOf(reply); wire.CodeOf(err) != wire.CodeForbidden || !strings.Contains(err.Error(), `lists provider "postgres"'s provisions only`) {
		t.Errorf("redis's provisions on postgres's subject: %v, want a 403", err)
	}
	if _, err := c.Provisions(ctx, &provisionerv1.ProvisionsRequest{}); !errors.Is(err, client.ErrNoProvider) {
		t.Errorf("no provider: %v, want client.ErrNoProvider", err)
	}
}

// An answer names only the providers' buckets its asker reads: a node's
// composition and its plan digest those its needs name, a provider's
// provisions its own; another's bucket is neither named (its provider's
// name, its revision) nor waited for.
func TestAnswersNameOnlyTheirAskersProvidersBuckets(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc, func(c *service.Config) { c.RevisionWait = 2 * time.Second })
	plans := servicetest.Bucket(t, nc, keys.PlansBucket)
	go func() { _ = svc.RunPlans(ctx, service.PlansConfig{KV: plans, Interval: 10 * time.Millisecond}) }()
	// bind makes provider's bucket and binds key in it.
	bind := func(provider, key string) uint64 {
		t.Helper()
		return put(t, providerBucket(t, nc, provider), key, []byte("bound"))
	}
	// need writes node's need of provider's db, and composes node once the
	// provider's key at rev is in.
	need := func(node, provider string, rev uint64) {
		t.Helper()
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		needs, err := c.PutNeed(ctx, "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: provider})
		if err != nil {
			t.Fatal(err)
		}
		least := &provisionerv1.Revisions{Needs: needs, Bound: map[string]uint64{wire.BoundBucket(provider): rev}}
		if _, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: node, MinRevisions: least}); err != nil {
			t.Fatal(err)
		}
	}
	pgRev := bind("pg", "ace.web.db")
	need("ace", "pg", pgRev)
	need("novox", "hidden", bind("hidden", "novox.web.db"))
	want := map[string]uint64{wire.BoundBucket("pg"): pgRev}

	ace := client.New(nc, client.AsNode("ace"))
	out, err := ace.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, out.GetRevisions().GetBound()); diff != "" {
		t.Errorf("ace's composition names providers' buckets (-want +got):\n%s", diff)
	}
	// Asked for a revision of another's bucket: not waited for.
	asked := &provisionerv1.Revisions{Bound: map[string]uint64{wire.BoundBucket("hidden"): 1 << 40}}
	if out, err := ace.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: asked}); err != nil {
		t.Errorf("ace asking for a revision of hidden's bucket: %v", err)
	} else if diff := cmp.Diff(want, out.GetRevisions().GetBound()); diff != "" {
		t.Errorf("ace's composition, asked at hidden's bucket, names (-want +got):\n%s", diff)
	}
	natstest.CheckFor(t, 10*time.Second, func() error {
		e, err := plans.Get(ctx, "ace")
		if err != nil {
			return err
		}
		d := &provisionerv1.PlanDigest{}
		if err := proto.Unmarshal(e.Value(), d); err != nil {
			return err
		}
		if diff := cmp.Diff(want, d.GetRevisions().GetBound()); diff != "" {
			return fmt.Errorf("ace's plan digest names providers' buckets (-want +got):\n%s", diff)
		}
		return nil
	})
	provisions, err := client.New(nc).Provisions(ctx, &provisionerv1.ProvisionsRequest{Provider: "pg"})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, provisions.GetRevisions().GetBound()); diff != "" {
		t.Errorf("pg's provisions name providers' buckets (-want +got):\n%s", diff)
	}
}

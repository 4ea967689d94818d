package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// On a nats-server whose authorization is what the permissions command
// prints (the writer with --providers pg): novox, which runs provider pg,
// declares pg's manifest with its own node client; ace needs a database of
// pg, pending until pg binds it in its own bucket, then bound, seen by ace
// with min_revisions; and no node can read pg's bucket.
func TestAProvisionIsBoundOnARealServer(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	serveAuthorized(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	// ace runs pg: its grant names it (permissions --node ace --providers
	// pg). novox's does not: its declaration is refused.
	ace := connectAs(t, s, wire.RoleNode, "ace")
	aceClient, err := nodeclient.New(ctx, nodeclient.Config{Conn: ace.nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	digest, manifestRev, err := aceClient.PutManifest(ctx, "pg", &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}})
	if err != nil {
		t.Fatalf("ace declares pg's manifest: %v (violations %v)", err, ace.violations)
	}
	novox := connectAs(t, s, wire.RoleNode, "novox")
	novoxClient, err := nodeclient.New(ctx, nodeclient.Config{Conn: novox.nc, Node: "novox"})
	if err != nil {
		t.Fatal(err)
	}
	short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	if _, _, err := novoxClient.PutManifest(short, "pg", &provisionerv1.Manifest{}); err == nil || !novox.violated(wire.DeclareSubjectOf("novox", "pg")) {
		t.Errorf("novox declared pg's manifest: %v (violations %v)", err, novox.violations)
	}
	needRev, err := aceClient.PutNeed(ctx, "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg"})
	if err != nil {
		t.Fatal(err)
	}
	asAce := client.New(ace.nc, client.AsNode("ace"))
	compose := func(least *provisionerv1.Revisions) *provisionerv1.Provision {
		t.Helper()
		// A look for pg's bucket that outlasts its 1s timeout (a loaded
		// machine) says the bucket is behind until the next look, 2s on:
		// asked again until then, the plan must come whole.
		var whole *provisionerv1.Provision
		natstest.CheckFor(t, 10*time.Second, func() error {
			plan, err := asAce.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: least})
			if err != nil {
				t.Fatalf("ace composes: %v (violations %v)", err, ace.violations)
			}
			if len(plan.GetProvisions()) != 1 || len(plan.GetBehind()) != 0 {
				return fmt.Errorf("ace's plan: %v, want one provision and nothing behind", plan)
			}
			whole = plan.GetProvisions()[0]
			return nil
		})
		return whole
	}
	if p := compose(&provisionerv1.Revisions{Needs: needRev, Manifests: manifestRev}); p.GetBoundRevision() != 0 || p.GetManifestDigest() != digest {
		t.Errorf("before pg binds: %v, want pending, offered by manifest %s", p, digest)
	}

	// pg binds its entry through the service, which makes its bucket.
	pg := connectAs(t, s, wire.RoleProvider, "pg")
	boundRev, err := client.New(pg.nc).Bind(ctx, "pg", "ace.web.db", []byte("postgres://ace-web@db/ace"))
	if err != nil {
		t.Fatalf("pg binds: %v (violations %v)", err, pg.violations)
	}
	p := compose(&provisionerv1.Revisions{Bound: map[string]uint64{wire.BoundBucket("pg"): boundRev}})
	if p.GetBoundRevision() != boundRev {
		t.Errorf("after pg binds at revision %d: %v, want bound at it", boundRev, p)
	}

	// A node reads no provider's bucket.
	// nats-server drops the denied request: it goes unanswered.
	short, cancelShort = context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelShort()
	if _, err := ace.js.KeyValue(short, wire.BoundBucket("pg")); err == nil {
		t.Error("ace binds pg's bucket")
	}
	if !ace.violated("$JS.API.STREAM.INFO.KV_pg_bound") {
		t.Error("ace's read of pg's bucket was not refused by nats-server")
	}
}

package main

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// TestPutUnderTheNodesPermissions writes and deletes a need, an applied
// record, a collection item and a manifest with put and delete, as node ace, on a
// nats-server that authorizes ace with what permissions --node ace prints;
// and ace cannot write novox's.
func TestPutUnderTheNodesPermissions(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	serveAuthorized(t, s)
	ctx := context.Background()
	aceURL := "nats://ace:ace-secret@" + strings.TrimPrefix(s.ClientURL(), "nats://")
	admin := connectAs(t, s, "", "admin")
	js, err := jetstream.New(admin.nc)
	if err != nil {
		t.Fatal(err)
	}
	cmd := func(args ...string) (string, error) {
		var out, errOut bytes.Buffer
		err := run(ctx, append(args, "--nats-url", aceURL), &out, &errOut)
		return out.String(), err
	}
	read := func(bucket, key string, into proto.Message) bool {
		t.Helper()
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := proto.Unmarshal(e.Value(), into); err != nil {
			t.Fatal(err)
		}
		return true
	}

	out, err := cmd("put", "need", "--node", "ace", "--module", "web", "--placeholder", "${port:http}", "--required")
	if err != nil || !strings.HasPrefix(out, "put mesh-provisioner_needs ace.web.port.http at revision ") {
		t.Fatalf("put need: %v %q", err, out)
	}
	var need provisionerv1.Need
	if !read(keys.NeedsBucket, "ace.web.port.http", &need) || need.GetPlaceholder() != "${port:http}" || !need.GetRequired() {
		t.Errorf("the need written: %v", &need)
	}
	if _, err := cmd("put", "applied", "--node", "ace", "--module", "web", "--plan-digest", "sha256:x", "--placeholders", "${port:http}"); err != nil {
		t.Fatal(err)
	}
	var applied provisionerv1.Applied
	if !read(keys.AppliedBucket, "ace.web", &applied) || applied.GetPlanDigest() != "sha256:x" || len(applied.GetPlaceholders()) != 1 {
		t.Errorf("the applied record written: %v", &applied)
	}
	if _, err := cmd("put", "collect", "--node", "ace", "--collection", "shell:zsh:normal", "--contributor", "web", "--value", "export PORT=8080", "--order", "10", "--attributes", "a=b"); err != nil {
		t.Fatal(err)
	}
	var item provisionerv1.CollectItem
	if !read(keys.CollectBucket, "ace."+keys.Escape("shell:zsh:normal")+".web", &item) || item.GetValue() != "export PORT=8080" || item.GetOrder() != 10 || item.GetAttributes()["a"] != "b" {
		t.Errorf("the collection item written: %v", &item)
	}

	if _, err := cmd("put", "need", "--node", "ace", "--module", "web", "--placeholder", "${port:quic}", "--builds", "b2"); err != nil {
		t.Fatal(err)
	}
	if !read(keys.NeedsBucket, "ace.web.port.quic", &need) || !slices.Equal(need.GetBuilds(), []string{"b2"}) {
		t.Errorf("the need of build b2 written: %v", &need)
	}
	if _, err := cmd("put", "applied", "--node", "ace", "--module", "api", "--wanted-build", "b1", "--newest-build", "b2"); err != nil {
		t.Fatal(err)
	}
	if !read(keys.AppliedBucket, "ace.api", &applied) || applied.GetWantedBuild() != "b1" || applied.GetNewestBuild() != "b2" {
		t.Errorf("the applied record with builds written: %v", &applied)
	}
	out, err = cmd("put", "manifest", "--node", "ace", "--provider", "pg", "--offers", "db,ro", "--attributes", "version=16")
	if err != nil || !strings.HasPrefix(out, "put mesh-provisioner_manifests ace.pg (sha256:") {
		t.Fatalf("put manifest: %v %q", err, out)
	}
	var manifest provisionerv1.Manifest
	if !read(keys.ManifestsBucket, "ace.pg", &manifest) || len(manifest.GetOffers()) != 2 || manifest.GetAttributes()["version"] != "16" {
		t.Errorf("the manifest written: %v", &manifest)
	}

	if out, err := cmd("put", "need", "--node", "novox", "--module", "web", "--placeholder", "${port:http}"); err == nil {
		t.Errorf("ace wrote novox's need: %q", out)
	}
	if out, err := cmd("put", "manifest", "--node", "novox", "--provider", "pg", "--offers", "db"); err == nil {
		t.Errorf("ace wrote novox's manifest: %q", out)
	}

	for _, args := range [][]string{
		{"delete", "need", "--node", "ace", "--module", "web", "--placeholder", "${port:http}"},
		{"delete", "applied", "--node", "ace", "--module", "web"},
		{"delete", "collect", "--node", "ace", "--collection", "shell:zsh:normal", "--contributor", "web"},
		{"delete", "manifest", "--node", "ace", "--provider", "pg"},
	} {
		if out, err := cmd(args...); err != nil || !strings.HasPrefix(out, "deleted ") {
			t.Errorf("%v: %v %q", args, err, out)
		}
	}
	if read(keys.NeedsBucket, "ace.web.port.http", &need) {
		t.Error("the need is still there after delete")
	}
	if _, err := cmd("put", "need", "--node", "ace", "--module", "web", "--placeholder", "port:http"); err == nil || !strings.Contains(err.Error(), "${kind:name}") {
		t.Errorf("a placeholder without ${}: %v", err)
	}
}

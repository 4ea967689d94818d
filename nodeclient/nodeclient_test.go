package nodeclient_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

func TestClientWritesItsNodesKeys(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	servicetest.Start(t, nc)
	if _, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "a.b"}); !errors.Is(err, keys.ErrInvalidPart) {
		t.Fatalf("New with node a.b = %v, want ErrInvalidPart", err)
	}
	c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}

	need := &provisionerv1.Need{Placeholder: "${port:http}", Required: true}
	if _, err := c.PutNeed(ctx, "web", "port", "http", need); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutApplied(ctx, "web", &provisionerv1.Applied{PlanDigest: "d"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutCollectItem(ctx, "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "v"}); err != nil {
		t.Fatal(err)
	}
	needs, _ := js.KeyValue(ctx, keys.NeedsBucket)
	e, err := needs.Get(ctx, "ace.web.port.http")
	if err != nil {
		t.Fatal(err)
	}
	got := &provisionerv1.Need{}
	if err := proto.Unmarshal(e.Value(), got); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(need, got, protocmp.Transform()); diff != "" {
		t.Errorf("stored need (-want +got):\n%s", diff)
	}
	collect, _ := js.KeyValue(ctx, keys.CollectBucket)
	if _, err := collect.Get(ctx, "ace.shell=3Azsh=3Anormal.web"); err != nil {
		t.Errorf("collection item under its escaped key: %v", err)
	}

	for _, del := range []func() (uint64, error){
		func() (uint64, error) { return c.DeleteNeed(ctx, "web", "port", "http") },
		func() (uint64, error) { return c.DeleteApplied(ctx, "web") },
		func() (uint64, error) { return c.DeleteCollectItem(ctx, "shell:zsh:normal", "web") },
	} {
		if revision, err := del(); err != nil || revision == 0 {
			t.Fatalf("delete: revision %d, %v", revision, err)
		}
	}
	if _, err := needs.Get(ctx, "ace.web.port.http"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Errorf("after DeleteNeed, Get = %v", err)
	}

	manifest := &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}}
	digest, revision, err := c.PutManifest(ctx, "pg", manifest)
	data, _ := proto.MarshalOptions{Deterministic: true}.Marshal(manifest)
	if err != nil || revision == 0 || digest != wire.ManifestDigest(data) {
		t.Errorf("PutManifest = %q, %d, %v; want %q at a revision", digest, revision, err, wire.ManifestDigest(data))
	}
}

func TestApplyNeedsWritesWhatDiffersAndDeletesWhatIsGone(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc)
	c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	need := func(name string) nodeclient.ModuleNeed {
		return nodeclient.ModuleNeed{Kind: "port", Name: name, Need: &provisionerv1.Need{Placeholder: "${port:" + name + "}"}}
	}
	first, err := c.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http"), need("admin"), need("debug")})
	if err != nil {
		t.Fatal(err)
	}
	if first.GetWritten() != 3 || first.GetDeleted() != 0 || first.GetUnchanged() != 0 {
		t.Errorf("first apply = %v, want 3 written", first)
	}
	// Another module's need is not the set's to delete.
	if _, err := c.PutNeed(ctx, "api", "port", "http", need("http").Need); err != nil {
		t.Fatal(err)
	}
	changed := need("admin")
	changed.Need.Required = true
	second, err := c.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http"), changed})
	if err != nil {
		t.Fatal(err)
	}
	if second.GetWritten() != 1 || second.GetDeleted() != 1 || second.GetUnchanged() != 1 || second.GetRevision() <= first.GetRevision() {
		t.Errorf("second apply = %v, want 1 written, 1 deleted, 1 unchanged after revision %d", second, first.GetRevision())
	}
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	var held []string
	lister, err := needs.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for key := range lister.Keys() {
		held = append(held, key)
	}
	slices.Sort(held)
	if want := []string{"ace.api.port.http", "ace.web.port.admin", "ace.web.port.http"}; !slices.Equal(held, want) {
		t.Errorf("keys after the applies = %v, want %v", held, want)
	}
	again, err := c.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http"), changed})
	if err != nil || again.GetWritten() != 0 || again.GetDeleted() != 0 || again.GetUnchanged() != 2 || again.GetRevision() < second.GetRevision() {
		t.Errorf("the same set again = %v, %v; want nothing written at revision %d or later", again, err, second.GetRevision())
	}

	// A key of the module stored just before the apply is compared too:
	// by this client (its put's revision named in the apply, which waits
	// for the copy to hold it), or by another writer this client knows
	// nothing of, as another client's apply knows nothing (the service
	// reads the module's newest write from the bucket). Either way the
	// apply deletes the key.
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:late}"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 20 {
		applier := c
		if i%2 == 0 {
			if _, err := c.PutNeed(ctx, "web", "port", fmt.Sprintf("late%d", i), &provisionerv1.Need{Placeholder: "${port:late}"}); err != nil {
				t.Fatal(err)
			}
		} else {
			if _, err := needs.Put(ctx, fmt.Sprintf("ace.web.port.late%d", i), value); err != nil {
				t.Fatal(err)
			}
			applier, _ = nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
		}
		got, err := applier.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http"), changed})
		if err != nil || got.GetDeleted() != 1 || got.GetUnchanged() != 2 {
			t.Fatalf("apply %d after a key stored just before = %v, %v; want it deleted, the set unchanged", i, got, err)
		}
	}
}

//nolint:tparallel // each step checks the streams the steps before it left empty.
func TestClientRefusesInvalidPartsBeforeSending(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	js, _ := jetstream.New(nc)
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name  string
		write func() error
		says  string
	}{
		{"module with a dot", func() error { _, err := c.PutNeed(ctx, "w.b", "port", "http", nil); return err }, `module "w.b" holds '.'`},
		{"empty kind", func() error { _, err := c.PutNeed(ctx, "web", "", "http", nil); return err }, `kind "" is empty`},
		{"empty name", func() error { _, err := c.DeleteNeed(ctx, "web", "port", ""); return err }, "name is empty"},
		{"wildcard kind", func() error { _, err := c.DeleteNeed(ctx, "web", ">", "x"); return err }, `kind ">" holds '>'`},
		{"module with a space", func() error { _, err := c.PutApplied(ctx, "my web", nil); return err }, `module "my web" holds ' '`},
		{"empty collection", func() error { _, err := c.PutCollectItem(ctx, "", "web", nil); return err }, "collection is empty"},
		{"contributor with a colon", func() error { _, err := c.DeleteCollectItem(ctx, "env", "a:b"); return err }, `contributor "a:b" holds ':'`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.write()
			if !errors.Is(err, keys.ErrInvalidPart) || !strings.Contains(err.Error(), tt.says) {
				t.Errorf("error = %v, want ErrInvalidPart saying %q", err, tt.says)
			}
		})
	}
	for _, bucket := range keys.StateBuckets() {
		s, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			t.Fatal(err)
		}
		if n := s.CachedInfo().State.LastSeq; n != 0 {
			t.Errorf("bucket %s got %d messages from refused writes", bucket, n)
		}
	}
}

// A client names its last write of a module's needs in the module's next
// apply, so the service does not ask the bucket for it: one direct get for
// a module it has not written yet, none after; a write of the module by
// another client of the node is read from the bucket by the apply that
// does not know of it, and so is one after a failed write.
func TestApplyNamesTheModulesLastWrite(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc)
	gets, err := nc.SubscribeSync("$JS.API.DIRECT.GET." + wire.StreamOf(keys.NeedsBucket))
	if err != nil {
		t.Fatal(err)
	}
	asked := func() int {
		n := 0
		for {
			if _, err := gets.NextMsg(100 * time.Millisecond); err != nil {
				return n
			}
			n++
		}
	}
	need := func(name string, required bool) nodeclient.ModuleNeed {
		return nodeclient.ModuleNeed{Kind: "port", Name: name, Need: &provisionerv1.Need{Placeholder: "${port:" + name + "}", Required: required}}
	}
	// settle waits until the service's copy holds an apply's revision: an
	// apply naming a revision the copy does not hold yet reads the bucket
	// by design, and on a loaded machine the copy can be a moment behind
	// the write's acknowledgement.
	reader := client.New(nc)
	settle := func(out *provisionerv1.ApplyResponse) {
		t.Helper()
		if _, err := reader.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: out.GetRevision()}); err != nil {
			t.Fatalf("read at revision %d: %v", out.GetRevision(), err)
		}
	}
	c, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	out, err := c.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http", false)})
	if err != nil {
		t.Fatal(err)
	}
	settle(out)
	if n := asked(); n != 1 {
		t.Errorf("the first apply of web asked the bucket %d times, want 1", n)
	}
	for _, required := range []bool{true, false} {
		out, err := c.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http", required)})
		if err != nil {
			t.Fatal(err)
		}
		settle(out)
	}
	if n := asked(); n != 0 {
		t.Errorf("two more applies of web asked the bucket %d times, want 0", n)
	}

	// Another client of ace writes web's need; the first knows nothing of
	// it, and its apply of the set it had keeps the set it had.
	other, _ := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if _, err := other.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http", true)}); err != nil {
		t.Fatal(err)
	}
	if n := asked(); n != 1 {
		t.Errorf("another client's first apply of web asked the bucket %d times, want 1", n)
	}
	out, err = other.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http", true)})
	if err != nil || out.GetUnchanged() != 1 {
		t.Fatalf("the same set again: %v, %v; want 1 unchanged", out, err)
	}
	_ = asked()

	// A write that fails may have been stored all the same: the module's
	// last write is unknown again, and the next apply asks the bucket.
	if _, err := other.PutNeed(ctx, "web", "port", "huge", &provisionerv1.Need{Placeholder: "${port:huge}", Local: strings.Repeat("x", 128<<10)}); err == nil {
		t.Fatal("a need of 128 KiB was stored")
	}
	if _, err := other.ApplyNeeds(ctx, "web", []nodeclient.ModuleNeed{need("http", false)}); err != nil {
		t.Fatal(err)
	}
	if n := asked(); n != 1 {
		t.Errorf("the apply after a failed write asked the bucket %d times, want 1", n)
	}
}

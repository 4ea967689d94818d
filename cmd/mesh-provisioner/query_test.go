package main

import (
	"bytes"
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
)

var update = flag.Bool("update", false, "rewrite the golden files of the query command")

// queryMesh serves a small mesh, written in a fixed order so that revisions
// are the same on every run, and returns its URL.
func queryMesh(t *testing.T) string {
	t.Helper()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	servicetest.Start(t, nc)
	ctx := context.Background()
	must := func(_ uint64, err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, node := range []string{"ace", "novox"} {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		must(c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true}))
		must(c.PutNeed(ctx, "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "db", Local: "ro"}))
		must(c.PutApplied(ctx, "web", &provisionerv1.Applied{PlanDigest: "sha256:" + node, AppliedAt: timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), Placeholders: []string{"${port:http}", "${bound:db}"}}))
		must(c.PutCollectItem(ctx, "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "export PORT=8080", Order: 10}))
		must(c.PutNeed(ctx, "web", "shell", "zsh:normal", &provisionerv1.Need{Placeholder: "${shell:zsh:normal}"}))
		if node == "novox" { // novox runs pg, which has bound ace's need
			_, _, err := c.PutManifest(ctx, "pg", &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}})
			must(0, err)
		}
	}
	js, _ := jetstream.New(nc)
	pg, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	must(pg.Put(ctx, "ace.web.db.ro", []byte("postgres://...")))
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	must(needs.Put(ctx, "ace.web.port", nil))
	must(needs.Put(ctx, "novox.api.config.url", []byte{0xff, 0xff}))
	// Wait until the copy holds every write: ask with each bucket's last
	// revision (read your writes).
	for _, what := range []provisionerv1.What{provisionerv1.What_WHAT_NEEDS, provisionerv1.What_WHAT_APPLIED, provisionerv1.What_WHAT_COLLECT, provisionerv1.What_WHAT_MANIFESTS} {
		bucket := map[provisionerv1.What]string{provisionerv1.What_WHAT_NEEDS: keys.NeedsBucket, provisionerv1.What_WHAT_APPLIED: keys.AppliedBucket, provisionerv1.What_WHAT_COLLECT: keys.CollectBucket, provisionerv1.What_WHAT_MANIFESTS: keys.ManifestsBucket}[what]
		stream, err := js.Stream(ctx, "KV_"+bucket)
		if err != nil {
			t.Fatal(err)
		}
		last := stream.CachedInfo().State.LastSeq
		if _, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: what, MinRevision: last}); err != nil {
			t.Fatalf("the copy of %s at revision %d: %v", bucket, last, err)
		}
	}
	return s.ClientURL()
}

func TestQueryTables(t *testing.T) {
	t.Parallel()
	url := queryMesh(t)
	tests := []struct {
		golden string
		args   []string
	}{
		{"registry", []string{"registry"}},
		{"needs", []string{"needs"}},
		{"needs_ace_web", []string{"needs", "--node", "ace", "--module", "web"}},
		{"applied_novox", []string{"applied", "--node", "novox"}},
		{"collect_shell", []string{"collect", "--collection", "shell:zsh:normal", "--contributor", "web"}},
		{"compose_ace", []string{"compose", "--node", "ace"}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			if err := run(context.Background(), append([]string{"query"}, append(tt.args, "--nats-url", url)...), &out, &errOut); err != nil {
				t.Fatalf("query %v: %v\n%s", tt.args, err, errOut.String())
			}
			golden := filepath.Join("testdata", "query_"+tt.golden+".golden")
			if *update {
				if err := os.WriteFile(golden, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./cmd/mesh-provisioner -run TestQueryTables -update)", err)
			}
			if diff := cmp.Diff(string(want), out.String()); diff != "" {
				t.Errorf("query %v (-golden +got):\n%s", tt.args, diff)
			}
		})
	}
}

func TestQueryJSONAndErrors(t *testing.T) {
	t.Parallel()
	url := queryMesh(t)
	var out bytes.Buffer
	if err := run(context.Background(), []string{"query", "collect", "--node", "ace", "--json", "--nats-url", url}, &out, &bytes.Buffer{}); err != nil {
		t.Fatal(err)
	}
	var answer provisionerv1.ProvisioningResponse
	if err := protojson.Unmarshal(out.Bytes(), &answer); err != nil {
		t.Fatalf("--json output does not decode: %v\n%s", err, out.String())
	}
	if len(answer.GetCollect()) != 1 || answer.GetCollect()[0].GetCollection() != "shell:zsh:normal" {
		t.Errorf("--json answer: %v", &answer)
	}

	tests := []struct {
		args []string
		says string
	}{
		{[]string{"query", "needs", "--contributor", "web", "--nats-url", url}, "the service refused: 400: filter contributor does not apply to WHAT_NEEDS"},
		{[]string{"query", "everything", "--nats-url", url}, `query "everything": ask registry, needs, applied, collect, manifests or compose`},
		{[]string{"query", "compose", "--nats-url", url}, "the service refused: 400: node is required"},
		{[]string{"query", "compose", "--node", "ace", "--contributor", "web", "--nats-url", url}, "--contributor and --collection do not apply"},
		{[]string{"query", "needs", "--nats-url", "nats://127.0.0.1:1"}, "cannot reach NATS at nats://127.0.0.1:1"},
	}
	for _, tt := range tests {
		err := run(context.Background(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tt.says) {
			t.Errorf("%v: error %v, want one saying %q", tt.args, err, tt.says)
		}
	}
}

// query's errors say what to do: start the service when none answers, with
// the URL tried, and the limit a name broke, the name cut to 64 characters.
func TestQuerySaysWhatToDo(t *testing.T) {
	t.Parallel()
	bare := natstest.Start(t) // a NATS where no service ran
	served := natstest.Start(t)
	servicetest.Start(t, natstest.Connect(t, served))
	long := strings.Repeat("a", 70_000)
	cut := `"` + long[:64] + `…"`
	noService := func(url string) string {
		return "no mesh-provisioner service answers on the NATS at " + url + ": start the service first (mesh-provisioner serve, with --nats-url naming that NATS), then run this again"
	}
	authed := "nats://ace:ace-secret@" + strings.TrimPrefix(bare.ClientURL(), "nats://")
	tests := []struct {
		name string
		args []string
		err  string
	}{
		{"needs before any service ran", []string{"query", "needs", "--nats-url", bare.ClientURL()}, noService(bare.ClientURL())},
		{"the registry as a node before any service ran", []string{"query", "registry", "--inbox-prefix", "_INBOX_MESH.node.ace", "--nats-url", bare.ClientURL()}, noService(bare.ClientURL())},
		{"compose before any service ran, the password not shown", []string{"query", "compose", "--node", "ace", "--nats-url", authed}, noService("nats://ace:xxxxx@" + strings.TrimPrefix(bare.ClientURL(), "nats://"))},
		{"a node of 70,000 characters", []string{"query", "needs", "--node", long, "--nats-url", served.ClientURL()},
			"query needs: --node " + cut + " is 70000 bytes, more than the 256 a name may take: shorten it"},
		{"a node of 70,000 characters to watch", []string{"query", "compose", "--node", long, "--watch", "--nats-url", served.ClientURL()},
			"query compose: --node " + cut + " is 70000 bytes, more than the 256 a name may take: shorten it"},
		{"a word of 70,000 characters", []string{"query", long, "--nats-url", served.ClientURL()},
			`query ` + cut + `: ask registry, needs, applied, collect, manifests or compose`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := run(context.Background(), tt.args, &bytes.Buffer{}, &bytes.Buffer{})
			if err == nil || err.Error() != tt.err {
				t.Errorf("error\n  %v\nwant\n  %s", err, tt.err)
			}
		})
	}
}

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
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
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

// put's errors say what to do: start the service when none answers, the
// limit a value or a name broke (the name cut to 64 characters), and, for
// a need the service stores but no composition resolves as written, "did
// you mean" the kind or provider one edit away.
func TestPutSaysWhatToDo(t *testing.T) {
	t.Parallel()
	bare := natstest.Start(t) // a NATS where no service ran
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	servicetest.Start(t, nc)
	ctx := context.Background()
	for node, provider := range map[string]string{"ace": "pg", "novox": "mysql"} {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			t.Fatal(err)
		}
		if _, _, err := c.PutManifest(ctx, provider, &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}}); err != nil {
			t.Fatal(err)
		}
	}
	long := strings.Repeat("a", 70_000)
	cut := `"` + long[:64] + `…"`
	need := func(placeholder string, more ...string) []string {
		return append([]string{"put", "need", "--node", "ace", "--module", "web", "--placeholder", placeholder}, more...)
	}
	tests := []struct {
		name   string
		url    string
		args   []string
		err    string // the whole error, or empty: the put succeeds
		stderr string // the whole of stderr
	}{
		{name: "before any service ran", url: bare.ClientURL(), args: need("${port:http}"),
			err: "no mesh-provisioner service answers on the NATS at " + bare.ClientURL() + ": start the service first (mesh-provisioner serve, with --nats-url naming that NATS), then run this again"},
		{name: "a value over the bucket's largest", args: []string{"put", "collect", "--node", "ace", "--collection", "c", "--contributor", "web", "--value", strings.Repeat("x", 70_000)},
			err: "the service refused: 413: the value of ace.c.web is 70004 bytes, more than the 64 KiB (65536 bytes) mesh-provisioner_collect takes of one value: write a smaller one, or have the operator raise it (serve --max-value-size)"},
		{name: "a value over what NATS carries", args: []string{"put", "collect", "--node", "ace", "--collection", "c", "--contributor", "web", "--value", strings.Repeat("x", 2<<20)},
			err: "the write is more than the NATS at " + s.ClientURL() + " carries in one message (max_payload, 1048576 bytes), and the service takes far less of one value (64 KiB unless serve --max-value-size says otherwise): write a smaller value"},
		{name: "a node of 70,000 characters", args: []string{"put", "need", "--node", long, "--module", "web", "--placeholder", "${port:http}"},
			err: "put need: --node " + cut + " is 70000 bytes, more than the 256 a name may take: shorten it"},
		{name: "a module of 70,000 characters", args: []string{"put", "applied", "--node", "ace", "--module", long},
			err: "put applied: --module " + cut + " is 70000 bytes, more than the 256 a name may take: shorten it"},
		{name: "a kind of 70,000 characters", args: need("${" + long + ":http}"),
			err: "put need: the placeholder's kind " + cut + " is 70000 bytes, more than the 256 a name may take: shorten it"},
		{name: "a provider of 70,000 characters", args: []string{"delete", "manifest", "--node", "ace", "--provider", long},
			err: "delete manifest: --provider " + cut + " is 70000 bytes, more than the 256 a name may take: shorten it"},
		{name: "a placeholder out of shape, at length", args: need(long),
			err: "--placeholder " + cut + ": write it as ${kind:name}, such as ${port:http}"},
		{name: "a known kind", args: need("${port:http}")},
		{name: "a kind one edit from a known one", args: need("${prt:http}"),
			stderr: `warning: no registry entry answers kind "prt": did you mean "port"? The need is written, and compositions refuse it until an entry answers "prt" (query registry lists the kinds).` + "\n"},
		{name: "a kind far from every known one", args: need("${gpu:x}"),
			stderr: `warning: no registry entry answers kind "gpu". The need is written, and compositions refuse it until an entry answers "gpu" (query registry lists the kinds).` + "\n"},
		{name: "a provider with a manifest", args: need("${bound:db}", "--provider", "pg")},
		{name: "a provider one edit from the node's own", args: need("${bound:db}", "--provider", "pgg"),
			stderr: `warning: no manifest names provider "pgg": did you mean "pg"? The need is written, and its provision stays pending until provider "pgg" binds it.` + "\n"},
		{name: "a provider far from every known one", args: need("${bound:cache}", "--provider", "redis")},
		{name: "a provider one edit from another node's, as an operator", args: need("${bound:db2}", "--provider", "mysq", "--inbox-prefix", "_INBOX"),
			stderr: `warning: no manifest names provider "mysq": did you mean "mysql"? The need is written, and its provision stays pending until provider "mysq" binds it.` + "\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			url := tt.url
			if url == "" {
				url = s.ClientURL()
			}
			var out, errOut bytes.Buffer
			err := run(ctx, append(tt.args, "--nats-url", url), &out, &errOut)
			if tt.err != "" {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error\n  %v\nwant\n  %s", err, tt.err)
				}
				return
			}
			if err != nil || !strings.HasPrefix(out.String(), "put mesh-provisioner_needs ace.web.") {
				t.Fatalf("put: %v %q", err, out.String())
			}
			if errOut.String() != tt.stderr {
				t.Errorf("stderr\n  %q\nwant\n  %q", errOut.String(), tt.stderr)
			}
		})
	}
}

func TestDidYouMean(t *testing.T) {
	t.Parallel()
	known := []string{"port", "dir", "seat", "pg", "pgx", "port"}
	tests := []struct{ word, want string }{
		{"prt", `: did you mean "port"?`},   // a deletion
		{"porrt", `: did you mean "port"?`}, // an insertion
		{"pott", `: did you mean "port"?`},  // a substitution
		{"prot", "."},                       // a transposition is two edits
		{"port", "."},                       // itself is no edit
		{"pgg", `: did you mean "pg" or "pgx"?`},
		{"p", `: did you mean "pg"?`},
		{"", "."},
		{"gpu", "."},
	}
	for _, tt := range tests {
		t.Run(tt.word, func(t *testing.T) {
			t.Parallel()
			if got := didYouMean(tt.word, known); got != tt.want {
				t.Errorf("didYouMean(%q) = %q, want %q", tt.word, got, tt.want)
			}
		})
	}
}

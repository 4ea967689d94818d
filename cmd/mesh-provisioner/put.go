package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
)

const putSynopsis = `Usage: mesh-provisioner put need|applied|collect|manifest --node NODE [flags]

Writes one record of a node's provisioning state through the service's write
verbs, as the node's provisioner client does (package nodeclient), without
encoding protobuf by hand:

  put need --node ace --module web --placeholder '${port:http}' --required --builds b2
  put applied --node ace --module web --plan-digest xxh3:... --placeholders '${port:http}' --wanted-build b1 --newest-build b2
  put collect --node ace --collection shell:zsh:normal --contributor web --value 'export PORT=8080' --order 10
  put manifest --node g14 --provider postgres --offers db,ro --attributes version=16

It runs under the node's own permissions (mesh-provisioner permissions
--node NODE): connect with the node's --creds; the inbox prefix defaults to
the node's own, _INBOX_MESH.node.NODE. A manifest is declared only by a node
whose permissions name the provider (permissions --node NODE --hosts P). It
prints the key and the revision written (and a manifest's digest): ask with
min_revision that revision to see the write. A need whose kind no registry
entry answers, or whose provider is one edit from a provider with a manifest
the identity may read, is written all the same, and a warning on stderr says
so, with "did you mean" the known names one edit away.`

const deleteSynopsis = `Usage: mesh-provisioner delete need|applied|collect|manifest --node NODE [flags]

Deletes one record of a node's provisioning state, under the node's own
permissions, as put writes it:

  delete need --node ace --module web --placeholder '${port:http}'
  delete applied --node ace --module web
  delete collect --node ace --collection shell:zsh:normal --contributor web
  delete manifest --node g14 --provider postgres`

// nodeWriteFlags are put's and delete's flags.
type nodeWriteFlags struct {
	conn        connectFlags
	logs        logFlags
	timeout     time.Duration
	node        string
	module      string
	placeholder string
	collection  string
	contributor string
	// put only
	need         provisionerv1.Need
	planDigest   string
	placeholders string
	value        string
	order        int
	attributes   string
	builds       string
	wanted       string
	newest       string
	offers       string
}

func (f *nodeWriteFlags) register(fs *flag.FlagSet, put bool) {
	f.conn.registerClient(fs)
	f.logs.register(fs, slog.LevelWarn)
	fs.DurationVar(&f.timeout, "timeout", 5*time.Second, "how long the write may take")
	fs.StringVar(&f.node, "node", "", "the node whose state is written (required); its credentials' node")
	fs.StringVar(&f.module, "module", "", "the module (need, applied)")
	fs.StringVar(&f.placeholder, "placeholder", "", "the need's placeholder, such as ${port:http}: its kind and name make the key (need)")
	fs.StringVar(&f.collection, "collection", "", "the collection, by its readable name such as shell:zsh:normal (collect)")
	fs.StringVar(&f.contributor, "contributor", "", "the module contributing the item (collect)")
	fs.StringVar(&f.need.Provider, "provider", "", "the module that provisions it, for a bound need (need); the provider whose manifest it is (manifest)")
	if !put {
		return
	}
	fs.BoolVar(&f.need.Required, "required", false, "the need must be resolved (need)")
	fs.StringVar(&f.need.Provision, "provision", "", "what the provider provisions (need)")
	fs.StringVar(&f.need.Local, "local", "", "the local side of a bound need, such as ro (need)")
	fs.StringVar(&f.planDigest, "plan-digest", "", "the digest of the plan applied (applied)")
	fs.StringVar(&f.placeholders, "placeholders", "", "the placeholders applied, comma-separated (applied)")
	fs.StringVar(&f.value, "value", "", "the item's value (collect)")
	fs.IntVar(&f.order, "order", 0, "the item's order in its collection (collect)")
	fs.StringVar(&f.attributes, "attributes", "", "attributes, comma-separated key=value pairs: the item's (collect), the provider's (manifest)")
	fs.StringVar(&f.builds, "builds", "", "the builds of the module the need belongs to, comma-separated; none: every build (need)")
	fs.StringVar(&f.wanted, "wanted-build", "", "the build of the module the node wants (applied)")
	fs.StringVar(&f.newest, "newest-build", "", "the newest build of the module the node knows of (applied)")
	fs.StringVar(&f.offers, "offers", "", "the provisions the provider offers, comma-separated (manifest)")
}

func definePut(fs *flag.FlagSet) action {
	var f nodeWriteFlags
	f.register(fs, true)
	return func(ctx context.Context, inv invocation) error { return f.run(ctx, inv, "put") }
}

func defineDelete(fs *flag.FlagSet) action {
	var f nodeWriteFlags
	f.register(fs, false)
	return func(ctx context.Context, inv invocation) error { return f.run(ctx, inv, "delete") }
}

// kindAndName splits a placeholder ${kind:name} (the name may hold colons).
func kindAndName(placeholder string) (string, string, error) {
	inner, ok := strings.CutPrefix(placeholder, "${")
	if inner, ok2 := strings.CutSuffix(inner, "}"); ok && ok2 {
		if kind, name, ok := strings.Cut(inner, ":"); ok && kind != "" && name != "" {
			return kind, name, nil
		}
	}
	return "", "", fmt.Errorf("--placeholder %q: write it as ${kind:name}, such as ${port:http}", keys.Echo(placeholder))
}

func (f *nodeWriteFlags) run(ctx context.Context, inv invocation, verb string) error {
	what := inv.word
	if what != "need" && what != "applied" && what != "collect" && what != "manifest" {
		return fmt.Errorf("%s %q: %s need, applied, collect or manifest", verb, keys.Echo(what), verb)
	}
	if f.node == "" {
		return fmt.Errorf("%s %s: --node is required: the node whose state it is", verb, what)
	}
	var kind, name string
	switch what {
	case "need":
		var err error
		if kind, name, err = kindAndName(f.placeholder); err != nil {
			return err
		}
		if f.module == "" {
			return fmt.Errorf("%s need: --module is required", verb)
		}
	case "applied":
		if f.module == "" {
			return fmt.Errorf("%s applied: --module is required", verb)
		}
	case "collect":
		if f.collection == "" || f.contributor == "" {
			return fmt.Errorf("%s collect: --collection and --contributor are required", verb)
		}
	case "manifest":
		if f.need.GetProvider() == "" {
			return fmt.Errorf("%s manifest: --provider is required: the provider module whose manifest it is", verb)
		}
	}
	// A name the service would refuse for its length is refused here, before
	// anything is sent: a node's is its subject's last token, and a subject
	// of more than the NATS server's max_control_line closes the connection.
	for _, n := range []struct{ label, value string }{
		{"--node", f.node}, {"--module", f.module}, {"the placeholder's kind", kind}, {"the placeholder's name", name},
		{"--collection", f.collection}, {"--contributor", f.contributor}, {"--provider", f.need.GetProvider()},
	} {
		if err := keys.CheckLength(n.label, n.value); err != nil {
			return fmt.Errorf("%s %s: %w", verb, what, err)
		}
	}
	attributes, err := attributesOf(f.attributes)
	if err != nil {
		return err
	}
	if err := f.conn.resolve(inv.lookupEnv, defaultClientURL); err != nil {
		return err
	}
	if f.conn.inbox == "" {
		f.conn.inbox = nodeclient.InboxPrefix(f.node)
	}
	nc, ctx, done, err := openClient(ctx, inv, &f.logs, &f.conn, "mesh-provisioner "+verb, f.timeout)
	if err != nil {
		return err
	}
	defer done()
	c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc.Conn, Node: f.node})
	if err != nil {
		return f.explain(nc, err)
	}
	var key, bucket string
	var revision uint64
	switch what {
	case "need":
		bucket = keys.NeedsBucket
		key, err = keys.NeedKey{Node: f.node, Module: f.module, Kind: kind, Name: name}.Key()
		if err == nil && verb == "put" {
			f.need.Placeholder, f.need.Builds = f.placeholder, splitList(f.builds)
			revision, err = c.PutNeed(ctx, f.module, kind, name, &f.need)
		} else if err == nil {
			revision, err = c.DeleteNeed(ctx, f.module, kind, name)
		}
	case "applied":
		bucket = keys.AppliedBucket
		key, err = keys.AppliedKey{Node: f.node, Module: f.module}.Key()
		if err == nil && verb == "put" {
			applied := &provisionerv1.Applied{PlanDigest: f.planDigest, AppliedAt: timestamppb.Now(), Placeholders: splitList(f.placeholders),
				WantedBuild: f.wanted, NewestBuild: f.newest}
			revision, err = c.PutApplied(ctx, f.module, applied)
		} else if err == nil {
			revision, err = c.DeleteApplied(ctx, f.module)
		}
	case "collect":
		bucket = keys.CollectBucket
		key, err = keys.CollectKey{Node: f.node, Collection: f.collection, Contributor: f.contributor}.Key()
		if err == nil && verb == "put" {
			item := &provisionerv1.CollectItem{Value: f.value, Order: int32(f.order), Attributes: attributes} //nolint:gosec // an order is small
			revision, err = c.PutCollectItem(ctx, f.collection, f.contributor, item)
		} else if err == nil {
			revision, err = c.DeleteCollectItem(ctx, f.collection, f.contributor)
		}
	case "manifest":
		bucket = keys.ManifestsBucket
		key, err = keys.ManifestKey{Node: f.node, Provider: f.need.GetProvider()}.Key()
		if err == nil && verb == "put" {
			manifest := &provisionerv1.Manifest{Attributes: attributes}
			for _, offer := range splitList(f.offers) {
				manifest.Offers = append(manifest.Offers, &provisionerv1.Offer{Provision: offer})
			}
			var digest string
			digest, revision, err = c.PutManifest(ctx, f.need.GetProvider(), manifest)
			key += " (" + digest + ")"
		} else if err == nil {
			revision, err = c.DeleteManifest(ctx, f.need.GetProvider())
		}
	}
	if err != nil {
		return f.explain(nc, err)
	}
	if verb == "put" {
		_, err = fmt.Fprintf(inv.stdout, "put %s %s at revision %d\n", bucket, key, revision)
	} else {
		_, err = fmt.Fprintf(inv.stdout, "deleted %s %s at revision %d\n", bucket, key, revision)
	}
	if err == nil && verb == "put" && what == "need" {
		f.warnUnknown(ctx, inv.stderr, nc.Conn, kind)
	}
	return err
}

// warnUnknown writes a warning, once a need is written, when its kind is
// one no registry entry answers (compositions refuse such a need), and
// when its provider is one no manifest names while a known provider is one
// edit away: each says "did you mean" with the known names one edit away.
// The service stores both, since a kind or a provider may appear later, and
// its answer (a WriteResponse) has no field for a warning; so the command
// reads the registry and the manifests itself, as its identity may: a
// node's, the registry and the node's own manifests; an operator's, every
// manifest. A read that fails leaves the warning out: the need is written.
func (f *nodeWriteFlags) warnUnknown(ctx context.Context, w io.Writer, nc *nats.Conn, kind string) {
	c := client.New(nc, f.conn.clientOptions()...)
	if registry, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_REGISTRY}); err == nil {
		var kinds []string
		for _, r := range registry.GetRegistry() {
			kinds = append(kinds, r.GetKind())
		}
		if !slices.Contains(kinds, kind) {
			fmt.Fprintf(w, "warning: no registry entry answers kind %q%s The need is written, and compositions refuse it until an entry answers %q (query registry lists the kinds).\n",
				keys.Echo(kind), didYouMean(kind, kinds), keys.Echo(kind))
		}
	}
	provider := f.need.GetProvider()
	if provider == "" {
		return
	}
	manifests, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_MANIFESTS, Node: f.conn.node()})
	if err != nil {
		return
	}
	var providers []string
	for _, m := range manifests.GetManifests() {
		providers = append(providers, m.GetProvider())
	}
	if hint := didYouMean(provider, providers); hint != "." && !slices.Contains(providers, provider) {
		fmt.Fprintf(w, "warning: no manifest names provider %q%s The need is written, and its provision stays pending until provider %q binds it.\n",
			keys.Echo(provider), hint, keys.Echo(provider))
	}
}

// didYouMean ends a sentence about word: ": did you mean "port"?" when
// known holds names one edit (Levenshtein distance 1) from it, each once,
// sorted; else ".".
func didYouMean(word string, known []string) string {
	var near []string
	for _, k := range known {
		if oneEdit(word, k) && !slices.Contains(near, k) {
			near = append(near, k)
		}
	}
	if len(near) == 0 {
		return "."
	}
	slices.Sort(near)
	quoted := make([]string, len(near))
	for i, k := range near {
		quoted[i] = fmt.Sprintf("%q", keys.Echo(k))
	}
	return ": did you mean " + strings.Join(quoted, " or ") + "?"
}

// oneEdit reports whether a and b are one insertion, deletion or
// substitution of a byte apart (Levenshtein distance exactly 1).
func oneEdit(a, b string) bool {
	if len(a) > len(b) {
		a, b = b, a
	}
	if len(b)-len(a) > 1 || a == b {
		return false
	}
	i := 0
	for i < len(a) && a[i] == b[i] {
		i++
	}
	if len(a) == len(b) {
		return a[i+1:] == b[i+1:] // one substitution at i
	}
	return a[i:] == b[i+1:] // one insertion into a at i
}

// attributesOf reads --attributes: comma-separated key=value pairs.
func attributesOf(list string) (map[string]string, error) {
	out := map[string]string{}
	for _, kv := range splitList(list) {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return nil, fmt.Errorf("--attributes %q: write key=value pairs, comma-separated", list)
		}
		out[k] = v
	}
	return out, nil
}

// explain adds NATS's refusal, when there was one, to a write's error.
func (f *nodeWriteFlags) explain(nc *clientConn, err error) error {
	if errors.Is(err, keys.ErrInvalidPart) {
		return err
	}
	if errors.Is(err, nats.ErrMaxPayload) {
		return fmt.Errorf("the write is more than the NATS at %s carries in one message (max_payload, %d bytes), and the service takes far less of one value (64 KiB unless serve --max-value-size says otherwise): write a smaller value",
			redactURL(f.conn.url), nc.MaxPayload())
	}
	return requestError(err, nc.violations, f.conn.url)
}

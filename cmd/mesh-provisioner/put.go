package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
)

const putSynopsis = `Usage: mesh-provisioner put need|applied|collect|manifest --node NODE [flags]

Writes one record of a node's provisioning state through the service's write
verbs, as the node's provisioner client does (package nodeclient), without
encoding protobuf by hand:

  put need --node ace --module web --placeholder '${port:http}' --required --builds b2
  put applied --node ace --module web --plan-digest sha256:... --placeholders '${port:http}' --wanted-build b1 --newest-build b2
  put collect --node ace --collection shell:zsh:normal --contributor web --value 'export PORT=8080' --order 10
  put manifest --node g14 --provider postgres --offers db,ro --attributes version=16

It runs under the node's own permissions (mesh-provisioner permissions
--node NODE): connect with the node's --creds; the inbox prefix defaults to
the node's own, _INBOX_MESH.node.NODE. A manifest is declared only by a node
whose permissions name the provider (permissions --node NODE --hosts P). It
prints the key and the revision written (and a manifest's digest): ask with
min_revision that revision to see the write.`

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
	return "", "", fmt.Errorf("--placeholder %q: write it as ${kind:name}, such as ${port:http}", placeholder)
}

func (f *nodeWriteFlags) run(ctx context.Context, inv invocation, verb string) error {
	what := inv.word
	if what != "need" && what != "applied" && what != "collect" && what != "manifest" {
		return fmt.Errorf("%s %q: %s need, applied, collect or manifest", verb, what, verb)
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
	return err
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
	return requestError(err, nc.violations, f.conn.url)
}

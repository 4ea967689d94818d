package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

const querySynopsis = `Usage: mesh-provisioner query registry|needs|applied|collect|manifests|compose [flags]

Asks the verb mesh-provisioner.provisioning (or, for compose, the verb
mesh-provisioner.compose) and prints the answer: an aligned table for people,
malformed keys, provisions and refusals in sections of their own, or protobuf
JSON with --json. needs and applied are narrowed by --node and --module;
collect by --node, --contributor and --collection; manifests by --node and
--module (the provider); the registry by nothing; compose takes --node and,
to compose one module, --module. compose --watch prints the node's
composition, then each new one as its plan changes (the node's key of
mesh-provisioner_plans, watched), until interrupted. With a node's
inbox prefix (--inbox-prefix _INBOX_MESH.node.<node>) it asks as that node,
on the node's own subjects (mesh-provisioner.compose.<node>, ...), which is
all a node's permissions grant. Exits non-zero with the service's sentence
when it refuses the request.`

// whats maps the command's words to the request's what.
var whats = map[string]provisionerv1.What{
	"registry":  provisionerv1.What_WHAT_REGISTRY,
	"needs":     provisionerv1.What_WHAT_NEEDS,
	"applied":   provisionerv1.What_WHAT_APPLIED,
	"collect":   provisionerv1.What_WHAT_COLLECT,
	"manifests": provisionerv1.What_WHAT_MANIFESTS,
}

func defineQuery(fs *flag.FlagSet) action {
	var conn connectFlags
	conn.registerClient(fs)
	conn.registerAPIPrefix(fs, "where the node's plan is watched, with compose --watch")
	var logs logFlags
	logs.register(fs, slog.LevelWarn)
	timeout := fs.Duration("timeout", 5*time.Second, "how long to wait for the whole answer, every page")
	asJSON := fs.Bool("json", false, "print the answer as protobuf JSON")
	watchPlan := fs.Bool("watch", false, "with compose: print each new composition as the node's plan changes, until interrupted")
	var req provisionerv1.ProvisioningRequest
	fs.StringVar(&req.Node, "node", "", "only records of this node; for compose, the node composed")
	fs.StringVar(&req.Module, "module", "", "only records of this module (needs, applied, compose)")
	fs.StringVar(&req.Contributor, "contributor", "", "only items of this contributor (collect)")
	fs.StringVar(&req.Collection, "collection", "", "only items of this collection, by its readable name (collect)")
	return func(ctx context.Context, inv invocation) error {
		word := inv.word
		if word == "" {
			word = "registry"
		}
		what, ok := whats[word]
		if !ok && word != "compose" {
			return fmt.Errorf("query %q: ask registry, needs, applied, collect, manifests or compose", keys.Echo(word))
		}
		if *watchPlan && (word != "compose" || req.GetModule() != "") {
			return fmt.Errorf("query: --watch watches a node's whole plan: query compose --node NODE --watch")
		}
		if word == "compose" && (req.GetContributor() != "" || req.GetCollection() != "") {
			return fmt.Errorf("query compose: --contributor and --collection do not apply; compose takes --node and --module")
		}
		for _, n := range []struct{ label, value string }{
			{"--node", req.GetNode()}, {"--module", req.GetModule()}, {"--contributor", req.GetContributor()}, {"--collection", req.GetCollection()},
		} {
			if err := keys.CheckLength(n.label, n.value); err != nil {
				return fmt.Errorf("query %s: %w", word, err) // as the service would; a node's plan is watched on a subject that ends with it
			}
		}
		req.What = what
		if *watchPlan {
			*timeout = 0 // until interrupted
		}
		nc, ctx, done, err := openClient(ctx, inv, &logs, &conn, "mesh-provisioner query", *timeout)
		if err != nil {
			return err
		}
		defer done()
		watch := nc.violations
		c := client.New(nc.Conn, conn.clientOptions()...)
		if node := conn.node(); node != "" && req.GetNode() == "" && word != "registry" {
			req.Node = node // a node reads its own: what its subjects answer
		}
		if *watchPlan {
			err := c.WatchPlan(ctx, req.GetNode(), func(composed *provisionerv1.ComposeResponse) error {
				return printAnswer(inv.stdout, composed, *asJSON, func() error { return printComposition(inv.stdout, composed) })
			})
			return requestError(err, watch, conn.url)
		}
		var answer proto.Message
		var show func() error
		if word == "compose" {
			var composed *provisionerv1.ComposeResponse
			composed, err = c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: req.GetNode(), Module: req.GetModule()})
			answer, show = composed, func() error { return printComposition(inv.stdout, composed) }
		} else {
			var provisioning *provisionerv1.ProvisioningResponse
			provisioning, err = c.ProvisioningAll(ctx, &req)
			answer, show = provisioning, func() error { return printTable(inv.stdout, provisioning) }
		}
		if err := requestError(err, watch, conn.url); err != nil {
			return err
		}
		return printAnswer(inv.stdout, answer, *asJSON, show)
	}
}

// printAnswer prints an answer as protobuf JSON, or as show does.
func printAnswer(w io.Writer, answer proto.Message, asJSON bool, show func() error) error {
	if !asJSON {
		return show()
	}
	b, err := protojson.MarshalOptions{Multiline: true}.Marshal(answer)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintln(w, string(b))
	return err
}

// requestError says why a request of a client command failed, in one
// sentence: the service's refusal, NATS's refusal of this identity, or no
// instance answering (the service not started yet, most often: say so,
// with the URL tried).
func requestError(err error, watch *violations, url string) error {
	if err == nil {
		return nil
	}
	if werr, ok := errors.AsType[*wire.Error](err); ok {
		return fmt.Errorf("the service refused: %d: %s", werr.Code(), werr.Sentence())
	}
	if explained := watch.explain(err); explained != err { //nolint:errorlint // explain returns err itself when it has nothing to add
		return explained
	}
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("no mesh-provisioner service answers on the NATS at %s: start the service first (mesh-provisioner serve, with --nats-url naming that NATS), then run this again", redactURL(url))
	}
	return err
}

// printTable writes an answer as aligned columns, its malformed keys in a
// section of their own.
func printTable(w io.Writer, a *provisionerv1.ProvisioningResponse) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	rev := func(r uint64) string { return strconv.FormatUint(r, 10) }
	count := 0
	switch a.GetWhat() {
	case provisionerv1.What_WHAT_REGISTRY:
		row("KIND", "OWNER", "SOURCE", "REVISION")
		for _, r := range a.GetRegistry() {
			source := ""
			if b := r.GetEntry().GetBucket(); b != nil {
				source = "bucket " + b.GetBucket() + " key " + b.GetKeyShape()
			} else if v := r.GetEntry().GetVerb(); v != nil {
				source = "verb " + v.GetSubject() + " of " + v.GetSeat()
			}
			row(r.GetKind(), r.GetEntry().GetOwner(), source, rev(r.GetRevision()))
		}
		count = len(a.GetRegistry())
	case provisionerv1.What_WHAT_NEEDS:
		row("NODE", "MODULE", "KIND", "NAME", "PLACEHOLDER", "PROVIDER", "PROVISION", "LOCAL", "REQUIRED", "REVISION")
		for _, r := range a.GetNeeds() {
			n := r.GetNeed()
			row(r.GetNode(), r.GetModule(), r.GetKind(), r.GetName(), dash(n.GetPlaceholder()), dash(n.GetProvider()), dash(n.GetProvision()), dash(n.GetLocal()), strconv.FormatBool(n.GetRequired()), rev(r.GetRevision()))
		}
		count = len(a.GetNeeds())
	case provisionerv1.What_WHAT_APPLIED:
		row("NODE", "MODULE", "PLAN DIGEST", "APPLIED AT", "PLACEHOLDERS", "REVISION")
		for _, r := range a.GetApplied() {
			p := r.GetApplied()
			at := "-"
			if p.GetAppliedAt() != nil {
				at = p.GetAppliedAt().AsTime().UTC().Format(time.RFC3339)
			}
			row(r.GetNode(), r.GetModule(), dash(p.GetPlanDigest()), at, dash(strings.Join(p.GetPlaceholders(), " ")), rev(r.GetRevision()))
		}
		count = len(a.GetApplied())
	case provisionerv1.What_WHAT_COLLECT:
		row("NODE", "COLLECTION", "CONTRIBUTOR", "ORDER", "VALUE", "REVISION")
		for _, r := range a.GetCollect() {
			row(r.GetNode(), r.GetCollection(), r.GetContributor(), strconv.Itoa(int(r.GetItem().GetOrder())), strconv.Quote(r.GetItem().GetValue()), rev(r.GetRevision()))
		}
		count = len(a.GetCollect())
	case provisionerv1.What_WHAT_MANIFESTS:
		row("NODE", "PROVIDER", "OFFERS", "DIGEST", "REVISION")
		for _, r := range a.GetManifests() {
			var offers []string
			for _, o := range r.GetManifest().GetOffers() {
				offers = append(offers, o.GetProvision())
			}
			row(r.GetNode(), r.GetProvider(), dash(strings.Join(offers, " ")), r.GetDigest(), rev(r.GetRevision()))
		}
		count = len(a.GetManifests())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	fmt.Fprintf(w, "%d %s at revision %d\n", count, plural(count, "record"), a.GetRevision())
	if len(a.GetMalformed()) == 0 {
		return nil
	}
	fmt.Fprintf(w, "\nMalformed keys (%d): out of their bucket's shape, reported, not dropped\n", len(a.GetMalformed()))
	row("BUCKET", "KEY", "REVISION", "REASON")
	for _, m := range a.GetMalformed() {
		row(m.GetBucket(), m.GetKey(), rev(m.GetRevision()), m.GetReason())
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func plural(n int, word string) string {
	if n == 1 {
		return word
	}
	return word + "s"
}

// printComposition writes a composition as aligned columns: the plans, then
// provisions and refusals in sections of their own.
func printComposition(w io.Writer, a *provisionerv1.ComposeResponse) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	row("MODULE", "KIND", "NAME", "OWNER", "WHERE", "ITEMS", "BUILDS")
	items := 0
	for _, plan := range a.GetPlans() {
		for _, it := range plan.GetItems() {
			where, collected := "", "-"
			if b := it.GetBucket(); b != nil {
				where = b.GetBucket() + " " + b.GetKey()
			} else {
				where = "verb " + it.GetVerb().GetSubject()
			}
			if it.GetCollection() != "" {
				collected = strconv.Itoa(len(it.GetItems()))
			}
			row(plan.GetModule(), it.GetKind(), it.GetName(), it.GetOwner(), where, collected, dash(strings.Join(it.GetBuilds(), " ")))
			items++
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	r := a.GetRevisions()
	fmt.Fprintf(w, "%d %s in %d %s, at revisions registry %d, needs %d, collect %d; plan digest %s\n",
		items, plural(items, "need"), len(a.GetPlans()), plural(len(a.GetPlans()), "plan"), r.GetRegistry(), r.GetNeeds(), r.GetCollect(), dash(a.GetPlanDigest()))
	for _, plan := range a.GetPlans() {
		if plan.GetWantedBuild() != plan.GetNewestBuild() {
			fmt.Fprintf(w, "%s is between builds: wanted %s, newest %s\n", plan.GetModule(), plan.GetWantedBuild(), plan.GetNewestBuild())
		}
	}
	if len(a.GetProvisions()) > 0 {
		fmt.Fprintf(w, "\nProvisions (%d): what providers must provision\n", len(a.GetProvisions()))
		row("PROVIDER", "BUCKET", "KEY", "MODULE", "PROVISION", "STATE")
		for _, p := range a.GetProvisions() {
			state := "pending"
			if p.GetBoundRevision() > 0 {
				state = "bound at " + strconv.FormatUint(p.GetBoundRevision(), 10)
			}
			row(p.GetProvider(), p.GetBucket(), p.GetKey(), p.GetModule(), p.GetProvision(), state)
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	if len(a.GetRefusals()) > 0 {
		fmt.Fprintf(w, "\nRefusals (%d): needs that cannot be resolved\n", len(a.GetRefusals()))
		row("KEY", "REASON", "DETAIL")
		for _, r := range a.GetRefusals() {
			row(r.GetKey(), strings.TrimPrefix(r.GetReason().String(), "REFUSAL_REASON_"), r.GetDetail())
		}
	}
	return tw.Flush()
}

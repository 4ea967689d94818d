package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/novox/mesh-provisioner/internal/observe/meshstatus"
	"github.com/novox/mesh-provisioner/wire"
)

const statusSynopsis = `Usage: mesh-provisioner status [--json] [flags]

One screen for an operator of a mesh:

  - the instances serving, from micro discovery ($SRV.STATS.mesh-provisioner,
    every reply within --discovery-wait): id, version, start, seat (held or
    standby, where the instance reports one), and per endpoint its requests,
    errors, last error, answers, and the buckets its copy is loading or
    behind on;
  - each bucket: its stream's messages and last sequence, and its records,
    malformed keys and nodes, the revision its copy is at and the lag (the
    last write's revision minus that), as the longest serving instance
    counts them in its stats;
  - the nodes (first tokens of the needs' keys), their needs, and the
    malformed keys, counted;
  - with --records: the nodes with their needs, refusals by reason from
    composing at most --compose-nodes nodes (the first by name; it says how
    many of how many), and every malformed key.

Without --records, status reads no record: one $SRV.STATS, and each
bucket's stream info and last message. --records reads each bucket once
through the provisioning verb, page by page. It needs an identity that may
ask $SRV.STATS, read the streams' info and (with --records) ask both verbs:
an operator's, not a node's.`

// The report status prints (--json as is) and the status page shows.
type (
	statusReport   = meshstatus.Report
	instanceStatus = meshstatus.Instance
)

func defineStatus(fs *flag.FlagSet) action {
	var conn connectFlags
	conn.registerClient(fs)
	var logs logFlags
	logs.register(fs, slog.LevelWarn)
	timeout := fs.Duration("timeout", 10*time.Second, "how long the whole status may take")
	discoveryWait := fs.Duration("discovery-wait", 500*time.Millisecond, "how long to collect the instances' discovery replies")
	records := fs.Bool("records", false, "also read every record through the provisioning verb: list the nodes with their needs and every malformed key, and compose nodes to count refusals")
	composeNodes := fs.Int("compose-nodes", 20, "with --records, compose at most this many nodes (the first by name) to count refusals; 0 composes none")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	return func(ctx context.Context, inv invocation) error {
		nc, ctx, done, err := openClient(ctx, inv, &logs, &conn, "mesh-provisioner status", *timeout)
		if err != nil {
			return err
		}
		defer done()
		watch := nc.violations
		report, err := meshstatus.Gather(ctx, nc.Conn, meshstatus.Options{DiscoveryWait: *discoveryWait, Records: *records, ComposeNodes: *composeNodes})
		if err != nil {
			return requestError(err, watch, conn.url)
		}
		if *asJSON {
			b, err := json.MarshalIndent(report, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(inv.stdout, string(b))
			return err
		}
		return printStatus(inv.stdout, report)
	}
}

// printStatus writes the report as sections of aligned columns.
func printStatus(w io.Writer, r *statusReport) error {
	t := statusTable{w: w, tw: tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)}
	for _, section := range []func(statusTable, *statusReport) error{
		printInstances, printOverBudget, printPlans, printBuckets, printNodes, printRefusals, printProviders, printMalformed,
	} {
		if err := section(t, r); err != nil {
			return err
		}
	}
	return nil
}

// statusTable writes status's sections: lines to w, aligned rows through tw.
type statusTable struct {
	w  io.Writer
	tw *tabwriter.Writer
}

func (t statusTable) row(cells ...string)          { fmt.Fprintln(t.tw, strings.Join(cells, "\t")) }
func (t statusTable) line(format string, a ...any) { fmt.Fprintf(t.w, format+"\n", a...) }

func commaList(names []string) string { return dash(strings.Join(names, ",")) }
func num(n uint64) string             { return strconv.FormatUint(n, 10) }

// printInstances writes the instances found by discovery, an endpoint a row.
func printInstances(t statusTable, r *statusReport) error {
	t.line("Instances (%d) serving %s", len(r.Instances), wire.ServiceName)
	if len(r.Instances) == 0 {
		t.line("none answered discovery: no instance serves on this NATS")
		return nil
	}
	t.row("ID", "VERSION", "STARTED", "SEAT", "ENDPOINT", "REQUESTS", "REFUSED ON ARRIVAL", "ANSWERED", "FAILED AFTER ACCEPTANCE", "AVERAGE TIME", "STILL LOADING", "BEHIND ON")
	for _, in := range r.Instances {
		seat := dash(in.Seat)
		if in.Seat == "standby" && in.SeatHolder != "" {
			seat += " (held by " + in.SeatHolder + ")"
		}
		if in.SeatSince != "" {
			seat += " since " + in.SeatSince
		}
		for i, e := range in.Endpoints {
			id, version, started := in.ID, in.Version, in.Started.UTC().Format(time.RFC3339)
			if i > 0 {
				id, version, started, seat = "", "", "", ""
			}
			t.row(id, version, started, seat, e.Name, strconv.Itoa(e.Requests), strconv.Itoa(e.Errors), num(e.Answered), num(e.AnswerErrors),
				e.AverageDuration.Round(time.Microsecond).String(), commaList(e.Loading), commaList(e.Behind))
		}
	}
	if err := t.tw.Flush(); err != nil {
		return err
	}
	t.line("(refused on arrival: bad requests, the copy still loading, the queue full, as micro counts errors;\n" +
		" failed after acceptance: a 503 after waiting for a worker or a revision, or an answer that could not be sent)")
	for _, in := range r.Instances {
		for _, e := range in.Endpoints {
			if e.LastError != "" {
				t.line("last error of %s on %s: %s", in.ID, e.Name, e.LastError)
			}
		}
	}
	return nil
}

// printOverBudget writes, for each instance, the nodes over their budget in
// its copy.
func printOverBudget(t statusTable, r *statusReport) error {
	for _, in := range r.Instances {
		if len(in.OverBudget) == 0 {
			continue
		}
		t.line("\nNodes over their budget in the copy of %s (%d): keys beyond it are not held, and are listed as malformed", in.ID, len(in.OverBudget))
		t.row("BUCKET", "NODE", "KEYS HELD", "BYTES HELD", "KEYS REFUSED")
		for _, x := range in.OverBudget {
			t.row(x.GetBucket(), x.GetNode(), num(x.GetKeys()), num(x.GetBytes()), num(x.GetRefused()))
		}
		if err := t.tw.Flush(); err != nil {
			return err
		}
	}
	return nil
}

// printBuckets writes each bucket's stream and its copy.
func printBuckets(t statusTable, r *statusReport) error {
	t.line("\nBuckets (records, malformed keys, nodes, copy revision and lag as the longest serving instance's copy counts them)")
	t.row("BUCKET", "MESSAGES", "LAST SEQ", "RECORDS", "MALFORMED", "NODES", "COPY AT", "LAG")
	for _, b := range r.Buckets {
		t.row(b.Bucket, num(b.Messages), num(b.LastSeq), strconv.Itoa(b.Records), strconv.Itoa(b.Malformed), strconv.Itoa(b.Nodes), num(b.CopyAt), num(b.Lag))
	}
	return t.tw.Flush()
}

// printNodes writes the nodes and their needs.
func printNodes(t statusTable, r *statusReport) error {
	t.line("\nNodes (%d) with %d %s", r.Refusals.NodesTotal, r.Needs, plural(r.Needs, "need"))
	if len(r.Nodes) == 0 {
		if r.Refusals.NodesTotal > 0 {
			t.line("(listed with --records)")
		}
		return nil
	}
	t.row("NODE", "NEEDS")
	for _, n := range r.Nodes {
		t.row(n.Node, strconv.Itoa(n.Needs))
	}
	return t.tw.Flush()
}

// printRefusals writes the refusals of the nodes composed, by reason.
func printRefusals(t statusTable, r *statusReport) error {
	t.line("\nRefusals by reason, composing %d of %d %s (at most --compose-nodes, with --records)",
		r.Refusals.NodesComposed, r.Refusals.NodesTotal, plural(r.Refusals.NodesTotal, "node"))
	switch {
	case len(r.Refusals.ByReason) == 0 && len(r.Nodes) == 0 && r.Refusals.NodesTotal > 0:
		t.line("(counted with --records)")
		return nil
	case len(r.Refusals.ByReason) == 0:
		t.line("none")
		return nil
	}
	t.row("REASON", "NEEDS")
	for _, reason := range slices.Sorted(maps.Keys(r.Refusals.ByReason)) {
		t.row(reason, strconv.Itoa(r.Refusals.ByReason[reason]))
	}
	return t.tw.Flush()
}

// printPlans writes what the seat's holder did of mesh-provisioner_plans.
func printPlans(t statusTable, r *statusReport) error {
	for _, in := range r.Instances {
		p := in.Plans
		if in.Seat != "held" || p == nil {
			continue
		}
		t.line("\nPlan digests (mesh-provisioner_plans), kept by %s: %d written, last %s; %d compositions; %d pending, %d deferred; last pass %dms; %d failed",
			in.ID, p.GetWritten(), dash(p.GetLastWritten()), p.GetComposed(), p.GetPending(), p.GetDeferred(), p.GetLastPassMs(), p.GetFailed())
	}
	return nil
}

// printProviders writes the provisions of the nodes composed, by provider:
// how many its bucket holds (bound) and how many it has still to make.
func printProviders(t statusTable, r *statusReport) error {
	t.line("\nProvisions by provider, composing %d of %d %s (with --records)",
		r.Refusals.NodesComposed, r.Refusals.NodesTotal, plural(r.Refusals.NodesTotal, "node"))
	switch {
	case r.Refusals.NodesComposed == 0 && r.Refusals.NodesTotal > 0:
		t.line("(counted with --records)")
		return nil
	case len(r.Providers) == 0:
		t.line("none")
		return nil
	}
	t.row("PROVIDER", "BOUND", "PENDING", "MANIFEST")
	for _, p := range r.Providers {
		t.row(p.Provider, strconv.Itoa(p.Bound), strconv.Itoa(p.Pending), dash(p.Manifest))
	}
	return t.tw.Flush()
}

// printMalformed writes the malformed keys: counted per bucket, listed with
// --records.
func printMalformed(t statusTable, r *statusReport) error {
	malformed := 0
	for _, b := range r.Buckets {
		malformed += b.Malformed
	}
	t.line("\nMalformed keys (%d)", max(malformed, len(r.Malformed)))
	if len(r.Malformed) == 0 {
		if malformed > 0 {
			t.line("(listed with --records)")
		}
		return nil
	}
	t.row("BUCKET", "KEY", "REASON")
	for _, m := range r.Malformed {
		t.row(m.Bucket, m.Key, m.Reason)
	}
	return t.tw.Flush()
}

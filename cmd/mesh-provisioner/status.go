package main

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
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

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

const statusSynopsis = `Usage: mesh-provisioner status [--json] [flags]

One screen for an operator of a mesh:

  - the instances serving, from micro discovery ($SRV.STATS.mesh-provisioner,
    every reply within --discovery-wait): id, version, start, seat (held or
    standby, where the instance reports one), and per endpoint its requests,
    errors, last error, answers, and the buckets its copy is loading or
    behind on;
  - each bucket: its stream's messages and last sequence, its records and
    malformed keys as the service answers them, the revision the answering
    instance's copy is at, and the lag (the last write's revision minus that);
  - the nodes (first tokens of the needs' keys) with their needs;
  - refusals by reason, from composing at most --compose-nodes nodes (the
    first by name; it says how many of how many);
  - every malformed key.

Each bucket is read once through the provisioning verb, page by page. It
needs an identity that may ask $SRV.STATS, read the streams' info and ask
both verbs: an operator's, not a node's.`

// statusReport is what status prints; --json prints it as is.
type statusReport struct {
	Instances []instanceStatus `json:"instances"`
	Buckets   []bucketStatus   `json:"buckets"`
	Nodes     []nodeStatus     `json:"nodes"`
	Needs     int              `json:"needs"`
	Refusals  refusalsStatus   `json:"refusals"`
	Malformed []malformedKey   `json:"malformed"`
}

type instanceStatus struct {
	ID         string           `json:"id"`
	Version    string           `json:"version"`
	Started    time.Time        `json:"started"`
	Seat       string           `json:"seat,omitempty"`
	SeatSince  string           `json:"seat_since,omitempty"`
	SeatHolder string           `json:"seat_holder,omitempty"`
	Endpoints  []endpointStatus `json:"endpoints"`
	// OverBudget are the nodes over their budget in this instance's copy.
	OverBudget []overBudget `json:"over_budget"`
}

// overBudget is a node over its budget in one state bucket, as an
// instance's stats report it.
type overBudget struct {
	Bucket  string `json:"bucket"`
	Node    string `json:"node"`
	Keys    int    `json:"keys"`
	Bytes   int    `json:"bytes"`
	Refused int    `json:"refused"`
}

type endpointStatus struct {
	Name           string          `json:"name"`
	Subject        string          `json:"subject"`
	Requests       int             `json:"requests"`
	Errors         int             `json:"errors"`
	LastError      string          `json:"last_error,omitempty"`
	AverageTime    string          `json:"average_processing_time"`
	Answered       uint64          `json:"answered"`
	AnswerErrors   uint64          `json:"answer_errors"`
	Loading        []string        `json:"loading"`
	Behind         []string        `json:"behind"`
	Data           json.RawMessage `json:"data,omitempty"`
	averageTimeRaw time.Duration
}

// endpointData is the part of an endpoint's stats data status reads; the
// whole of it is kept in endpointStatus.Data.
type endpointData struct {
	Answered     uint64       `json:"answered"`
	AnswerErrors uint64       `json:"answer_errors"`
	Loading      []string     `json:"loading"`
	Behind       []string     `json:"behind"`
	Seat         string       `json:"seat"`
	SeatSince    string       `json:"seat_since"`
	SeatHolder   string       `json:"seat_holder"`
	OverBudget   []overBudget `json:"over_budget"`
}

type bucketStatus struct {
	Bucket    string `json:"bucket"`
	Messages  uint64 `json:"messages"`
	LastSeq   uint64 `json:"last_seq"`
	Records   int    `json:"records"`
	Malformed int    `json:"malformed"`
	CopyAt    uint64 `json:"copy_revision"`
	Lag       uint64 `json:"lag"`
}

type nodeStatus struct {
	Node  string `json:"node"`
	Needs int    `json:"needs"`
}

type refusalsStatus struct {
	NodesComposed int            `json:"nodes_composed"`
	NodesTotal    int            `json:"nodes_total"`
	ByReason      map[string]int `json:"by_reason"`
}

type malformedKey struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

func defineStatus(fs *flag.FlagSet) action {
	var conn connectFlags
	conn.registerClient(fs)
	var logs logFlags
	logs.register(fs, slog.LevelWarn)
	timeout := fs.Duration("timeout", 10*time.Second, "how long the whole status may take")
	discoveryWait := fs.Duration("discovery-wait", 500*time.Millisecond, "how long to collect the instances' discovery replies")
	composeNodes := fs.Int("compose-nodes", 20, "compose at most this many nodes (the first by name) to count refusals; 0 composes none")
	asJSON := fs.Bool("json", false, "print the status as JSON")
	return func(ctx context.Context, inv invocation) error {
		nc, ctx, done, err := openClient(ctx, inv, &logs, &conn, "mesh-provisioner status", *timeout)
		if err != nil {
			return err
		}
		defer done()
		watch := nc.violations
		report, err := gatherStatus(ctx, nc.Conn, *discoveryWait, *composeNodes)
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

// gatherStatus asks discovery, the streams and the verbs.
func gatherStatus(ctx context.Context, nc *nats.Conn, discoveryWait time.Duration, composeNodes int) (*statusReport, error) {
	report := &statusReport{Refusals: refusalsStatus{ByReason: map[string]int{}}, Malformed: []malformedKey{}}
	var err error
	if report.Instances, err = discoverInstances(ctx, nc, discoveryWait); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	c := client.New(nc)
	needsPerNode := map[string]int{}
	for _, bucket := range keys.Buckets() {
		// The answer first, then the stream: the lag is never negative,
		// and at worst counts writes made in between.
		answer, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: whatOf(bucket)})
		if err != nil {
			return nil, fmt.Errorf("read %s through the provisioning verb: %w", bucket, err)
		}
		stream, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			return nil, fmt.Errorf("stream of %s: %w", bucket, err)
		}
		state := stream.CachedInfo().State
		// The bucket's revision is its keys' last write: the registry's
		// stream holds the seat's lease too, renewed every few seconds.
		lastSeq := uint64(0)
		last, err := stream.GetLastMsgForSubject(ctx, "$KV."+bucket+".>")
		switch {
		case err == nil:
			lastSeq = last.Sequence
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, fmt.Errorf("last write of %s: %w", bucket, err)
		}
		b := bucketStatus{Bucket: bucket, Messages: state.Msgs, LastSeq: lastSeq, CopyAt: answer.GetRevision(),
			Records: len(answer.GetRegistry()) + len(answer.GetNeeds()) + len(answer.GetApplied()) + len(answer.GetCollect())}
		if b.LastSeq > b.CopyAt {
			b.Lag = b.LastSeq - b.CopyAt
		}
		for _, m := range answer.GetMalformed() {
			if m.GetBucket() != bucket {
				continue // reported with its own bucket
			}
			b.Malformed++
			report.Malformed = append(report.Malformed, malformedKey{Bucket: m.GetBucket(), Key: m.GetKey(), Reason: m.GetReason()})
		}
		for _, n := range answer.GetNeeds() {
			needsPerNode[n.GetNode()]++
		}
		if bucket == keys.NeedsBucket {
			report.Needs = len(answer.GetNeeds())
			for _, m := range answer.GetMalformed() {
				if node, _, _ := strings.Cut(m.GetKey(), "."); m.GetBucket() == bucket && node != "" {
					needsPerNode[node] += 0 // a node whose needs are all malformed is a node
				}
			}
		}
		report.Buckets = append(report.Buckets, b)
	}
	for _, node := range slices.Sorted(maps.Keys(needsPerNode)) {
		report.Nodes = append(report.Nodes, nodeStatus{Node: node, Needs: needsPerNode[node]})
	}
	report.Refusals.NodesTotal = len(report.Nodes)
	for _, n := range report.Nodes[:min(composeNodes, len(report.Nodes))] {
		composed, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: n.Node})
		if err != nil {
			return nil, fmt.Errorf("compose %s: %w", n.Node, err)
		}
		report.Refusals.NodesComposed++
		for _, r := range composed.GetRefusals() {
			report.Refusals.ByReason[strings.TrimPrefix(r.GetReason().String(), "REFUSAL_REASON_")]++
		}
	}
	return report, nil
}

// whatOf returns the provisioning verb's what that reads bucket.
func whatOf(bucket string) provisionerv1.What {
	return map[string]provisionerv1.What{
		keys.RegistryBucket: provisionerv1.What_WHAT_REGISTRY,
		keys.NeedsBucket:    provisionerv1.What_WHAT_NEEDS,
		keys.AppliedBucket:  provisionerv1.What_WHAT_APPLIED,
		keys.CollectBucket:  provisionerv1.What_WHAT_COLLECT,
	}[bucket]
}

// discoverInstances collects every instance's $SRV.STATS reply for wait:
// discovery is not queue-grouped, so each instance answers.
func discoverInstances(ctx context.Context, nc *nats.Conn, wait time.Duration) ([]instanceStatus, error) {
	inbox := nc.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	subject, err := micro.ControlSubject(micro.StatsVerb, wire.ServiceName, "")
	if err != nil {
		return nil, err
	}
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	var instances []instanceStatus
	for {
		msgCtx, cancel := context.WithDeadline(ctx, deadline)
		msg, err := sub.NextMsgWithContext(msgCtx)
		cancel()
		if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
			break // the wait is over
		}
		if err != nil {
			return nil, fmt.Errorf("discover instances on %s: %w", subject, err)
		}
		var stats micro.Stats
		if err := json.Unmarshal(msg.Data, &stats); err != nil {
			return nil, fmt.Errorf("a reply on %s does not decode: %w", subject, err)
		}
		instances = append(instances, instanceOf(stats))
	}
	slices.SortFunc(instances, func(a, b instanceStatus) int {
		return cmp.Or(a.Started.Compare(b.Started), strings.Compare(a.ID, b.ID))
	})
	return instances, nil
}

func instanceOf(stats micro.Stats) instanceStatus {
	in := instanceStatus{ID: stats.ID, Version: stats.Version, Started: stats.Started}
	for _, e := range stats.Endpoints {
		var data endpointData
		_ = json.Unmarshal(e.Data, &data) // what does not decode is shown raw in --json
		in.Seat, in.SeatSince = cmp.Or(in.Seat, data.Seat), cmp.Or(in.SeatSince, data.SeatSince)
		in.SeatHolder = cmp.Or(in.SeatHolder, data.SeatHolder)
		if in.OverBudget == nil { // every endpoint reports the same copy
			in.OverBudget = data.OverBudget
		}
		in.Endpoints = append(in.Endpoints, endpointStatus{
			Name: e.Name, Subject: e.Subject, Requests: e.NumRequests, Errors: e.NumErrors, LastError: e.LastError,
			AverageTime: e.AverageProcessingTime.String(), averageTimeRaw: e.AverageProcessingTime,
			Answered: data.Answered, AnswerErrors: data.AnswerErrors,
			Loading: nonNil(data.Loading), Behind: nonNil(data.Behind), Data: e.Data,
		})
	}
	return in
}

// printStatus writes the report as sections of aligned columns.
func printStatus(w io.Writer, r *statusReport) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cells ...string) { fmt.Fprintln(tw, strings.Join(cells, "\t")) }
	list := func(names []string) string { return dash(strings.Join(names, ",")) }
	num := func(n uint64) string { return strconv.FormatUint(n, 10) }

	fmt.Fprintf(w, "Instances (%d) serving %s\n", len(r.Instances), wire.ServiceName)
	if len(r.Instances) > 0 {
		row("ID", "VERSION", "STARTED", "SEAT", "ENDPOINT", "REQUESTS", "ERRORS", "ANSWERED", "ANSWER ERRORS", "AVERAGE", "LOADING", "BEHIND")
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
				row(id, version, started, seat, e.Name, strconv.Itoa(e.Requests), strconv.Itoa(e.Errors), num(e.Answered), num(e.AnswerErrors),
					e.averageTimeRaw.Round(time.Microsecond).String(), list(e.Loading), list(e.Behind))
			}
		}
		if err := tw.Flush(); err != nil {
			return err
		}
		for _, in := range r.Instances {
			for _, e := range in.Endpoints {
				if e.LastError != "" {
					fmt.Fprintf(w, "last error of %s on %s: %s\n", in.ID, e.Name, e.LastError)
				}
			}
		}
	} else {
		fmt.Fprintln(w, "none answered discovery: no instance serves on this NATS")
	}

	for _, in := range r.Instances {
		if len(in.OverBudget) == 0 {
			continue
		}
		fmt.Fprintf(w, "\nNodes over their budget in the copy of %s (%d): keys beyond it are not held, and are listed as malformed\n", in.ID, len(in.OverBudget))
		row("BUCKET", "NODE", "KEYS HELD", "BYTES HELD", "KEYS REFUSED")
		for _, x := range in.OverBudget {
			row(x.Bucket, x.Node, strconv.Itoa(x.Keys), strconv.Itoa(x.Bytes), strconv.Itoa(x.Refused))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}
	fmt.Fprintln(w, "\nBuckets (copy revision and lag as the answering instance's copy has them)")
	row("BUCKET", "MESSAGES", "LAST SEQ", "RECORDS", "MALFORMED", "COPY AT", "LAG")
	for _, b := range r.Buckets {
		row(b.Bucket, num(b.Messages), num(b.LastSeq), strconv.Itoa(b.Records), strconv.Itoa(b.Malformed), num(b.CopyAt), num(b.Lag))
	}
	if err := tw.Flush(); err != nil {
		return err
	}

	fmt.Fprintf(w, "\nNodes (%d) with %d %s\n", len(r.Nodes), r.Needs, plural(r.Needs, "need"))
	if len(r.Nodes) > 0 {
		row("NODE", "NEEDS")
		for _, n := range r.Nodes {
			row(n.Node, strconv.Itoa(n.Needs))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "\nRefusals by reason, composing %d of %d %s (at most --compose-nodes)\n",
		r.Refusals.NodesComposed, r.Refusals.NodesTotal, plural(r.Refusals.NodesTotal, "node"))
	if len(r.Refusals.ByReason) == 0 {
		fmt.Fprintln(w, "none")
	} else {
		row("REASON", "NEEDS")
		for _, reason := range slices.Sorted(maps.Keys(r.Refusals.ByReason)) {
			row(reason, strconv.Itoa(r.Refusals.ByReason[reason]))
		}
		if err := tw.Flush(); err != nil {
			return err
		}
	}

	fmt.Fprintf(w, "\nMalformed keys (%d)\n", len(r.Malformed))
	if len(r.Malformed) > 0 {
		row("BUCKET", "KEY", "REASON")
		for _, m := range r.Malformed {
			row(m.Bucket, m.Key, m.Reason)
		}
	}
	return tw.Flush()
}

// nonNil makes an absent list print as [] in JSON, as the service sends it.
func nonNil(list []string) []string {
	if list == nil {
		return []string{}
	}
	return list
}

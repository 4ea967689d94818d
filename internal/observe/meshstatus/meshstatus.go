package meshstatus

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Report is what status prints; --json prints it as is.
type Report struct {
	Instances []Instance `json:"instances"`
	Buckets   []Bucket   `json:"buckets"`
	Nodes     []Node     `json:"nodes"`
	Needs     int        `json:"needs"`
	Refusals  Refusals   `json:"refusals"`
	// Providers count the provisions of the nodes composed, by provider:
	// bound, or pending.
	Providers []Provider     `json:"providers"`
	Malformed []MalformedKey `json:"malformed"`
}

// Provider counts what the nodes composed ask of one provider.
type Provider struct {
	Provider string `json:"provider"`
	Bound    int    `json:"bound"`
	Pending  int    `json:"pending"`
	// Manifest is the digest of its manifest, empty when it has none.
	Manifest string `json:"manifest,omitempty"`
}

// Instance is one instance serving, as its $SRV.STATS reply reports it.
type Instance struct {
	ID         string     `json:"id"`
	Version    string     `json:"version"`
	Started    time.Time  `json:"started"`
	Seat       string     `json:"seat,omitempty"`
	SeatSince  string     `json:"seat_since,omitempty"`
	SeatHolder string     `json:"seat_holder,omitempty"`
	Endpoints  []Endpoint `json:"endpoints"`
	// OverBudget are the nodes over their budget in this instance's copy.
	OverBudget []*provisionerv1.OverBudget `json:"over_budget"`
	// Buckets are this instance's copy of each bucket, counted.
	Buckets []*provisionerv1.BucketStats `json:"-"`
	// Plans is what the instance did of mesh-provisioner_plans.
	Plans *provisionerv1.PlansStats `json:"plans,omitempty"`
}

// Endpoint is one endpoint of an instance with its counters.
type Endpoint struct {
	Name         string          `json:"name"`
	Subject      string          `json:"subject"`
	Requests     int             `json:"requests"`
	Errors       int             `json:"errors"`
	LastError    string          `json:"last_error,omitempty"`
	AverageTime  string          `json:"average_processing_time"`
	Answered     uint64          `json:"answered"`
	AnswerErrors uint64          `json:"answer_errors"`
	Loading      []string        `json:"loading"`
	Behind       []string        `json:"behind"`
	Data         json.RawMessage `json:"data,omitempty"`
	// DataError says why Data is not an EndpointStatsData, if it is not.
	DataError       string        `json:"data_error,omitempty"`
	AverageDuration time.Duration `json:"-"`
}

// Bucket is one bucket: its stream, and its records, malformed keys and
// revision as an instance's copy counts them in its stats.
type Bucket struct {
	Bucket    string `json:"bucket"`
	Messages  uint64 `json:"messages"`
	LastSeq   uint64 `json:"last_seq"`
	Records   int    `json:"records"`
	Malformed int    `json:"malformed"`
	// Nodes are the copy's first tokens of the bucket's keys: nodes, or
	// the registry's kinds.
	Nodes  int    `json:"nodes"`
	CopyAt uint64 `json:"copy_revision"`
	Lag    uint64 `json:"lag"`
	// Instance is the instance whose copy was counted; empty when none
	// reported one.
	Instance string `json:"instance,omitempty"`
}

// Node is a node that has needs (or malformed keys in the needs bucket).
type Node struct {
	Node  string `json:"node"`
	Needs int    `json:"needs"`
	// Composed says the node was composed (one of the first ComposeNodes):
	// only then are Refusals and Provisions counted.
	Composed bool `json:"composed"`
	// Refusals are its needs that cannot be resolved, by reason.
	Refusals map[string]int `json:"refusals,omitempty"`
	// Provisions counts what providers must provision for its bound needs.
	Provisions int `json:"provisions"`
}

// Refusals counts the refusals of the nodes composed, by reason.
type Refusals struct {
	NodesComposed int            `json:"nodes_composed"`
	NodesTotal    int            `json:"nodes_total"`
	ByReason      map[string]int `json:"by_reason"`
}

// MalformedKey is a key out of its bucket's shape.
type MalformedKey struct {
	Bucket string `json:"bucket"`
	Key    string `json:"key"`
	Reason string `json:"reason"`
}

// Options say what Gather reads.
type Options struct {
	// DiscoveryWait is how long to collect the instances' stats replies.
	DiscoveryWait time.Duration
	// Records reads every bucket through the provisioning verb, to list
	// the nodes with their needs and every malformed key, and composes the
	// first ComposeNodes nodes to count refusals. Without it, Gather reads
	// no record: the counts are the instances' stats.
	Records      bool
	ComposeNodes int
	// FailOnRefusal ends Gather as soon as NATS refuses the connection a
	// subscription or a publish, with a *RefusedError, rather than once
	// the answers that cannot come time out: for a connection whose owner
	// does not watch its permission violations itself.
	FailOnRefusal bool
}

// Gather asks discovery and the streams and, with opts.Records, the verbs.
// The buckets' counts are the first instance's (the longest serving) that
// reports them in its stats; the lag is its copy's.
//
// With opts.FailOnRefusal, a subscription or publish NATS refuses ends it
// at once with a *RefusedError: the reply inbox and discovery are checked
// by a round trip before any answer is waited for.
func Gather(ctx context.Context, nc *nats.Conn, opts Options) (*Report, error) {
	if !opts.FailOnRefusal {
		return gather(ctx, nc, opts, nil)
	}
	ctx, watch := watchRefusals(ctx, nc)
	defer watch.stop()
	report, err := gather(ctx, nc, opts, watch.check)
	if err != nil {
		return nil, watch.explain(err)
	}
	return report, nil
}

// gather is Gather; check, if not nil, returns a refusal of what was sent
// on nc before it.
func gather(ctx context.Context, nc *nats.Conn, opts Options, check func(context.Context) error) (*Report, error) {
	report := &Report{Refusals: Refusals{ByReason: map[string]int{}}, Providers: []Provider{}, Malformed: []MalformedKey{}}
	var err error
	if report.Instances, err = discoverInstances(ctx, nc, opts.DiscoveryWait, check); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	counted := map[string]*provisionerv1.BucketStats{}
	counter := ""
	for _, in := range report.Instances {
		if len(in.Buckets) > 0 {
			for _, b := range in.Buckets {
				counted[b.GetBucket()] = b
			}
			counter = in.ID
			break
		}
	}
	for _, bucket := range keys.Buckets() {
		// The stats first, then the stream: the lag is never negative,
		// and at worst counts writes made in between.
		stream, err := js.Stream(ctx, wire.StreamOf(bucket))
		if err != nil {
			return nil, fmt.Errorf("stream of %s: %w", bucket, err)
		}
		state := stream.CachedInfo().State
		// The bucket's revision is its keys' last write: the registry's
		// stream holds the seat's lease too, renewed every few seconds.
		lastSeq := uint64(0)
		last, err := stream.GetLastMsgForSubject(ctx, wire.KVSubject(bucket, ">"))
		switch {
		case err == nil:
			lastSeq = last.Sequence
		case !errors.Is(err, jetstream.ErrMsgNotFound):
			return nil, fmt.Errorf("last write of %s: %w", bucket, err)
		}
		c := counted[bucket]
		b := Bucket{Bucket: bucket, Messages: state.Msgs, LastSeq: lastSeq, CopyAt: c.GetRevision(),
			Records: int(c.GetRecords()), Malformed: int(c.GetMalformed()), Nodes: int(c.GetNodes())}
		if c != nil {
			b.Instance = counter
		}
		if b.LastSeq > b.CopyAt {
			b.Lag = b.LastSeq - b.CopyAt
		}
		if bucket == keys.NeedsBucket {
			report.Needs, report.Refusals.NodesTotal = b.Records, b.Nodes
		}
		report.Buckets = append(report.Buckets, b)
	}
	if opts.Records {
		if err := readRecords(ctx, nc, report, opts.ComposeNodes); err != nil {
			return nil, err
		}
	}
	return report, nil
}

// readRecords reads every bucket through the provisioning verb for the
// nodes with their needs and every malformed key, and composes the first
// composeNodes nodes to count refusals.
func readRecords(ctx context.Context, nc *nats.Conn, report *Report, composeNodes int) error {
	c := client.New(nc)
	needsPerNode := map[string]int{}
	for _, bucket := range keys.Buckets() {
		answer, err := c.ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: whatOfBucket(bucket)})
		if err != nil {
			return fmt.Errorf("read %s through the provisioning verb: %w", bucket, err)
		}
		for _, m := range answer.GetMalformed() {
			if m.GetBucket() != bucket {
				continue // reported with its own bucket
			}
			report.Malformed = append(report.Malformed, MalformedKey{Bucket: m.GetBucket(), Key: m.GetKey(), Reason: m.GetReason()})
		}
		if bucket != keys.NeedsBucket {
			continue
		}
		for _, n := range answer.GetNeeds() {
			needsPerNode[n.GetNode()]++
		}
		for _, m := range answer.GetMalformed() {
			if node, _, _ := strings.Cut(m.GetKey(), "."); m.GetBucket() == bucket && node != "" {
				needsPerNode[node] += 0 // a node whose needs are all malformed is a node
			}
		}
	}
	for _, node := range slices.Sorted(maps.Keys(needsPerNode)) {
		report.Nodes = append(report.Nodes, Node{Node: node, Needs: needsPerNode[node]})
	}
	report.Refusals.NodesTotal = len(report.Nodes)
	providers := map[string]*Provider{}
	defer func() {
		for _, name := range slices.Sorted(maps.Keys(providers)) {
			report.Providers = append(report.Providers, *providers[name])
		}
	}()
	for i := range report.Nodes[:min(composeNodes, len(report.Nodes))] {
		n := &report.Nodes[i]
		composed, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: n.Node})
		if err != nil {
			return fmt.Errorf("compose %s: %w", n.Node, err)
		}
		report.Refusals.NodesComposed++
		n.Composed, n.Provisions = true, len(composed.GetProvisions())
		for _, p := range composed.GetProvisions() {
			counts := providers[p.GetProvider()]
			if counts == nil {
				counts = &Provider{Provider: p.GetProvider(), Manifest: p.GetManifestDigest()}
				providers[p.GetProvider()] = counts
			}
			if p.GetBoundRevision() > 0 {
				counts.Bound++
			} else {
				counts.Pending++
			}
		}
		for _, r := range composed.GetRefusals() {
			reason := strings.TrimPrefix(r.GetReason().String(), "REFUSAL_REASON_")
			report.Refusals.ByReason[reason]++
			if n.Refusals == nil {
				n.Refusals = map[string]int{}
			}
			n.Refusals[reason]++
		}
	}
	return nil
}

// whatOfBucket returns the provisioning verb's what that reads bucket.
func whatOfBucket(bucket string) provisionerv1.What {
	return map[string]provisionerv1.What{
		keys.RegistryBucket:  provisionerv1.What_WHAT_REGISTRY,
		keys.NeedsBucket:     provisionerv1.What_WHAT_NEEDS,
		keys.AppliedBucket:   provisionerv1.What_WHAT_APPLIED,
		keys.CollectBucket:   provisionerv1.What_WHAT_COLLECT,
		keys.ManifestsBucket: provisionerv1.What_WHAT_MANIFESTS,
	}[bucket]
}

// discoverInstances collects every instance's $SRV.STATS reply for wait:
// discovery is not queue-grouped, so each instance answers. check, if not
// nil, is asked once the request is sent: a refused inbox or subject ends
// it before the wait.
func discoverInstances(ctx context.Context, nc *nats.Conn, wait time.Duration, check func(context.Context) error) ([]Instance, error) {
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
	if check != nil {
		if err := check(ctx); err != nil {
			return nil, err
		}
	}
	deadline := time.Now().Add(wait)
	var all []micro.Stats
	partitions := map[string][]micro.Stats{} // by the instance they are of
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
		if stats.Metadata[wire.MemberMetadata] != "" && stats.Metadata["partition"] == "" {
			continue // an announcement among instances sharing the partitions, no endpoint
		}
		if of := stats.Metadata[wire.PartitionOfInstance]; of != "" {
			partitions[of] = append(partitions[of], stats)
			continue
		}
		all = append(all, stats)
	}
	instances := make([]Instance, 0, len(all))
	for _, stats := range all {
		instances = append(instances, InstanceOf(wire.FoldPartitions(stats, partitions[stats.ID])))
	}
	slices.SortFunc(instances, func(a, b Instance) int {
		return cmp.Or(a.Started.Compare(b.Started), strings.Compare(a.ID, b.ID))
	})
	return instances, nil
}

// InstanceOf reads an instance's $SRV.STATS reply, its service data
// (EndpointStatsData) included.
func InstanceOf(stats micro.Stats) Instance {
	in := Instance{ID: stats.ID, Version: stats.Version, Started: stats.Started}
	for _, e := range stats.Endpoints {
		ep := Endpoint{
			Name: e.Name, Subject: e.Subject, Requests: e.NumRequests, Errors: e.NumErrors, LastError: e.LastError,
			AverageTime: e.AverageProcessingTime.String(), AverageDuration: e.AverageProcessingTime, Data: e.Data,
		}
		data, err := wire.DecodeStatsData(e.Data)
		if err != nil {
			ep.DataError = err.Error() // shown raw in --json
			data = &provisionerv1.EndpointStatsData{}
		}
		in.Seat, in.SeatSince = cmp.Or(in.Seat, data.GetSeat()), cmp.Or(in.SeatSince, data.GetSeatSince())
		in.SeatHolder = cmp.Or(in.SeatHolder, data.GetSeatHolder())
		if in.OverBudget == nil { // every endpoint reports the same copy
			in.OverBudget = data.GetOverBudget()
		}
		if in.Plans == nil {
			in.Plans = data.GetPlans()
		}
		if in.Buckets == nil {
			in.Buckets = data.GetBuckets()
		}
		// Refusals sent on the answering connection micro does not count.
		ep.Errors += int(data.GetRefused())
		ep.Answered, ep.AnswerErrors = data.GetAnswered(), data.GetAnswerErrors()
		ep.Loading, ep.Behind = nonNil(data.GetLoading()), nonNil(data.GetBehind())
		in.Endpoints = append(in.Endpoints, ep)
	}
	if in.OverBudget == nil {
		in.OverBudget = []*provisionerv1.OverBudget{} // [] in JSON, as the service sends it
	}
	return in
}

// nonNil makes an absent list print as [] in JSON, as the service sends it.
func nonNil(list []string) []string {
	if list == nil {
		return []string{}
	}
	return list
}

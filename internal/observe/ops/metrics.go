package ops

import (
	"context"
	"log/slog"
	"net/http"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

const namespace = "mesh_provisioner"

// Counters read from an endpoint's $SRV.STATS: micro's own, and the data
// the service adds. Each is a counter with the label endpoint.
var endpointCounters = []struct {
	name, help string
	read       func(e *micro.EndpointStats, d endpointData) float64
}{
	{"requests_total", "Requests received by the endpoint (micro's num_requests).",
		func(e *micro.EndpointStats, _ endpointData) float64 { return float64(e.NumRequests) }},
	{"errors_total", "Requests refused on arrival with an error: bad requests, the copy still loading, the queue full (micro's num_errors, and stats data refused for those sent once micro's handler had returned).",
		func(e *micro.EndpointStats, d endpointData) float64 {
			return float64(e.NumErrors) + float64(d.GetRefused())
		}},
	{"answers_total", "Answers sent by the service's workers or reused (stats data answered).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetAnswered()) }},
	{"answered_early_total", "Answers sent while the instance's copy was loading, from the asking node's keys read alone (stats data answered_early); counted in answers_total too.",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetAnsweredEarly()) }},
	{"answer_errors_total", "Requests accepted, then answered with an error or whose answer could not be sent (stats data answer_errors).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetAnswerErrors()) }},
	{"shed_total", "Requests answered 503 without being computed: they waited longer than --max-queue-wait for a worker (stats data shed).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetShed()) }},
	{"queue_full_total", "Requests answered 503 because the queue for workers was full (stats data queue_full).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetQueueFull()) }},
	{"asker_full_total", "Requests answered 503 because the node or provider that asked on its own subject already held as many requests at once as one asker may, --max-per-asker (stats data asker_full).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetAskerFull()) }},
	{"dropped_total", "Requests of nodes and providers dropped where they arrived, one an asker a second answered with why: their asker asked faster than --max-rate-per-asker, or than its requests were read (stats data dropped).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetDropped()) }},
	{"large_shed_total", "Answers over 64 KiB refused with a 503 because the bytes already queued for their asker, or for all askers, were at their bound (stats data large_shed); counted in answer_errors_total too.",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetLargeShed()) }},
	{"slow_consumer_total", "Times requests were dropped because the endpoint's pending buffer was full (stats data slow_consumer).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetSlowConsumer()) }},
	{"refused_replies_total", "Requests whose reply subject was refused, so no answer was sent (stats data refused_replies; 0 when the service does not report it).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetRefusedReplies()) }},
}

// endpointData is an endpoint's stats data.
type endpointData = *provisionerv1.EndpointStatsData

// initMetrics makes the registry: the Go runtime's and the process's
// collectors, the build's, the latency histograms and the service's own.
func (s *Server) initMetrics() {
	s.registry = prometheus.NewRegistry()
	s.latency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Namespace: namespace,
		Name:      "request_duration_seconds",
		Help:      "Time from a request's arrival to its answer or error being sent, by endpoint and code (200 for an answer).",
		Buckets:   []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10},
	}, []string{"endpoint", "code"})
	s.refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: namespace,
		Name:      "permission_violations_total",
		Help:      "Publishes and subscriptions of the service's connections that NATS refused, by identity: a look-up its grant does not allow (a provider's bucket a need names that the writer may not read), each logged at most once a minute.",
	}, []string{"identity"})
	s.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildInfo(s.cfg.Version),
		s.latency,
		s.refused,
		&serviceCollector{s: s},
	)
}

// CountRefusal counts a publish or subscription of identity's connection
// that NATS refused. Nil-safe: without --http there is nothing to count in.
func (s *Server) CountRefusal(identity string) {
	if s == nil {
		return
	}
	s.refused.WithLabelValues(identity).Inc()
}

// observe is the service's Observer.
func (s *Server) observe(endpoint string, code int, took time.Duration) {
	s.latency.WithLabelValues(endpoint, strconv.Itoa(code)).Observe(took.Seconds())
}

// buildInfo is mesh_provisioner_build_info: always 1, the build in its
// labels, as Prometheus's own programs report theirs (<program>_build_info,
// prometheus/common/version), so that a query can join it to any series.
// The version is the one micro discovery and mesh-provisioner version show
// (Config.Version, serve's buildVersion); the revision and the Go version
// are the binary's own build information. collectors.NewBuildInfoCollector
// (go_build_info) is not used: its version is the main module's as the go
// command stamped it, which ignores -ldflags -X main.version and so would
// disagree with the version discovery shows, and it has no revision.
func buildInfo(version string) prometheus.Collector {
	if version == "" {
		version = "unknown"
	}
	return prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Namespace: namespace,
		Name:      "build_info",
		Help:      "Always 1; its labels say the build: version (as micro discovery and mesh-provisioner version show it), revision (the VCS commit built, -modified when the tree had changes; unknown when not recorded) and goversion (the Go toolchain).",
		ConstLabels: prometheus.Labels{
			"version":   version,
			"revision":  vcsRevision(),
			"goversion": runtime.Version(),
		},
	}, func() float64 { return 1 })
}

// vcsRevision returns the commit the binary was built from, as the go
// command records it (vcs.revision), with "-modified" when the tree had
// changes (vcs.modified), as prometheus/common/version says it; "unknown"
// when none is recorded (go test, -buildvcs=false, no checkout).
func vcsRevision() string {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	revision, modified := "", false
	for _, s := range info.Settings {
		switch s.Key {
		case "vcs.revision":
			revision = s.Value
		case "vcs.modified":
			modified = s.Value == "true"
		}
	}
	if revision == "" {
		return "unknown"
	}
	if modified {
		revision += "-modified"
	}
	return revision
}

func (s *Server) metricsHandler() http.Handler {
	return promhttp.HandlerFor(s.registry, promhttp.HandlerOpts{
		ErrorLog:      slog.NewLogLogger(s.logger.Handler(), slog.LevelWarn),
		ErrorHandling: promhttp.ContinueOnError,
	})
}

// serviceCollector reads the service's counters and copies at each scrape,
// so that /metrics and $SRV.STATS never disagree.
type serviceCollector struct{ s *Server }

var (
	descReused = prometheus.NewDesc(namespace+"_answers_reused_total",
		"Answers reused from the answer cache rather than built again (stats data answer_cache.hits).", nil, nil)
	descRevision = prometheus.NewDesc(namespace+"_copy_revision",
		"The revision the service's copy of the bucket has reached (stats data buckets[].revision).", []string{"bucket"}, nil)
	descLag = prometheus.NewDesc(namespace+"_copy_lag_revisions",
		"The bucket's last write's revision minus the copy's revision; absent while NATS cannot be asked.", []string{"bucket"}, nil)
	descLoaded = prometheus.NewDesc(namespace+"_copy_loaded",
		"1 once the copy holds the bucket's initial values (the bucket is not in stats data loading).", []string{"bucket"}, nil)
	descBehind = prometheus.NewDesc(namespace+"_copy_behind",
		"1 while the copy is known to lag the bucket: its watcher is catching up (stats data behind).", []string{"bucket"}, nil)
	descRecords = prometheus.NewDesc(namespace+"_copy_records",
		"Records the copy holds of the bucket: its keys whose value decodes (stats data buckets[].records).", []string{"bucket"}, nil)
	descNodes = prometheus.NewDesc(namespace+"_copy_nodes",
		"Nodes in the copy of the bucket: the first tokens of its keys held or listed as malformed, which for the registry are its kinds (stats data buckets[].nodes).", []string{"bucket"}, nil)
	descMalformed = prometheus.NewDesc(namespace+"_malformed_keys",
		"Keys of the bucket out of its shape, or over their node's budget, in the copy (stats data buckets[].malformed).", []string{"bucket"}, nil)
	descOverBudget = prometheus.NewDesc(namespace+"_nodes_over_budget",
		"Nodes over their budget (--node-max-keys, --node-max-bytes) in the bucket; not reported for the registry.", []string{"bucket"}, nil)
	descSeatHeld = prometheus.NewDesc(namespace+"_seat_held",
		"1 while this instance holds the provisioner seat, 0 while it stands by.", nil, nil)
	descSeatSince = prometheus.NewDesc(namespace+"_seat_since_timestamp_seconds",
		"Since when this instance holds the seat or stands by, in Unix seconds.", nil, nil)
	descReady = prometheus.NewDesc(namespace+"_ready",
		"1 while /readyz answers 200.", nil, nil)
	descDroppedBy = prometheus.NewDesc(namespace+"_asker_dropped_total",
		"Requests of one node or provider dropped where they arrived, for the ten askers with the most on each endpoint (stats data dropped_by_asker).",
		[]string{"endpoint", "role", "name"}, nil)
	descShutOuts = prometheus.NewDesc(namespace+"_partition_shut_outs_total",
		"Times this instance shut a partition of nodes and providers out (serve --partitions): one of its askers asked far past its rate, so its subjects were unsubscribed for a while (stats data shut_out[].times).",
		[]string{"partition"}, nil)
	descShutOut = prometheus.NewDesc(namespace+"_partitions_shut_out",
		"Partitions this instance has shut out now, whose askers hear no responders (stats data shut_out[] with until).", nil, nil)

	// The plans writer: what this instance did of mesh-provisioner_plans
	// while it held the seat, counted since it started (stats data plans).
	descPlansWritten = prometheus.NewDesc(namespace+"_plans_written_total",
		"Plan digests written to mesh-provisioner_plans because a node's plan changed or it had none, while this instance held the seat (stats data plans.written).", nil, nil)
	descPlansComposed = prometheus.NewDesc(namespace+"_plans_composed_total",
		"Compositions the plans writer made to learn whether a node's plan changed (stats data plans.composed).", nil, nil)
	descPlansFailed = prometheus.NewDesc(namespace+"_plans_failed_total",
		"Plan digest writes that failed, the bucket unreachable or written by another, each retried on the writer's next pass (stats data plans.failed).", nil, nil)
	descPlansPending = prometheus.NewDesc(namespace+"_plans_pending",
		"Nodes whose plan may have changed and is not composed yet: how far behind the plans writer is (stats data plans.pending).", nil, nil)
	descPlansDeferred = prometheus.NewDesc(namespace+"_plans_deferred",
		"Nodes with a change whose composition the plans writer puts off, at its last look: a node of thousands of records is composed again no sooner than nine times its composition's cost (stats data plans.deferred).", nil, nil)
	descPlansLastPass = prometheus.NewDesc(namespace+"_plans_last_pass_duration_seconds",
		"How long the plans writer's last pass took, from the changes it saw to their digests written (stats data plans.last_pass_ms).", nil, nil)
	descPlansLastWritten = prometheus.NewDesc(namespace+"_plans_last_written_timestamp_seconds",
		"When the plans writer last wrote a digest, in Unix seconds; absent until it has (stats data plans.last_written).", nil, nil)
)

// serviceDescs are the collector's descriptions but the endpoints' counters.
var serviceDescs = []*prometheus.Desc{
	descReused, descRevision, descLag, descLoaded, descBehind, descRecords, descNodes, descMalformed, descOverBudget,
	descSeatHeld, descSeatSince, descReady, descDroppedBy, descShutOuts, descShutOut,
	descPlansWritten, descPlansComposed, descPlansFailed, descPlansPending, descPlansDeferred, descPlansLastPass, descPlansLastWritten,
}

func descOf(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, []string{"endpoint"}, nil)
}

func (c *serviceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range endpointCounters {
		ch <- descOf(m.name, m.help)
	}
	for _, d := range serviceDescs {
		ch <- d
	}
}

func (c *serviceCollector) Collect(ch chan<- prometheus.Metric) {
	ready := 0.0
	if len(c.s.notReady()) == 0 {
		ready = 1
	}
	ch <- prometheus.MustNewConstMetric(descReady, prometheus.GaugeValue, ready)
	t := c.s.current()
	if t == nil {
		return
	}
	stats := t.Service.Stats()
	var first endpointData
	for _, e := range stats.Endpoints {
		d, err := wire.DecodeStatsData(e.Data)
		if err != nil {
			d = &provisionerv1.EndpointStatsData{} // what does not decode counts 0
		}
		if first == nil {
			first = d
		}
		for _, m := range endpointCounters {
			ch <- prometheus.MustNewConstMetric(descOf(m.name, m.help), prometheus.CounterValue, m.read(e, d), e.Name)
		}
		for _, x := range d.GetDroppedByAsker() {
			ch <- prometheus.MustNewConstMetric(descDroppedBy, prometheus.CounterValue, float64(x.GetDropped()), e.Name, x.GetRole(), x.GetName())
		}
	}
	overBudget := map[string]int{}
	if first != nil {
		// The cache, the seat, the plans writer and the copy are the
		// service's, whichever endpoint reports them.
		ch <- prometheus.MustNewConstMetric(descReused, prometheus.CounterValue, float64(first.GetAnswerCache().GetHits()))
		for _, x := range first.GetOverBudget() {
			overBudget[x.GetBucket()]++
		}
		if first.GetSeat() != "" {
			held := 0.0
			if first.GetSeat() == "held" {
				held = 1
			}
			ch <- prometheus.MustNewConstMetric(descSeatHeld, prometheus.GaugeValue, held)
			if since, err := time.Parse(time.RFC3339, first.GetSeatSince()); err == nil {
				ch <- prometheus.MustNewConstMetric(descSeatSince, prometheus.GaugeValue, float64(since.Unix()))
			}
		}
		collectPlans(ch, first.GetPlans())
		shutOut := 0
		for _, x := range first.GetShutOut() {
			ch <- prometheus.MustNewConstMetric(descShutOuts, prometheus.CounterValue, float64(x.GetTimes()), strconv.Itoa(int(x.GetPartition())))
			if x.GetUntil() != "" {
				shutOut++
			}
		}
		ch <- prometheus.MustNewConstMetric(descShutOut, prometheus.GaugeValue, float64(shutOut))
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(c.s.cfg.Timeout, 2*time.Second))
	defer cancel()
	for _, b := range bucketsOf(first, t.Service.Copies()) {
		ch <- prometheus.MustNewConstMetric(descRevision, prometheus.GaugeValue, float64(b.revision), b.bucket)
		ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, boolValue(b.loaded), b.bucket)
		ch <- prometheus.MustNewConstMetric(descBehind, prometheus.GaugeValue, boolValue(b.behind), b.bucket)
		ch <- prometheus.MustNewConstMetric(descMalformed, prometheus.GaugeValue, float64(b.malformed), b.bucket)
		if b.counted {
			ch <- prometheus.MustNewConstMetric(descRecords, prometheus.GaugeValue, float64(b.records), b.bucket)
			ch <- prometheus.MustNewConstMetric(descNodes, prometheus.GaugeValue, float64(b.nodes), b.bucket)
		}
		if b.bucket != keys.RegistryBucket {
			ch <- prometheus.MustNewConstMetric(descOverBudget, prometheus.GaugeValue, float64(overBudget[b.bucket]), b.bucket)
		}
		if t.Read == nil || !t.Read.IsConnected() {
			continue
		}
		last, err := LastRevision(ctx, t.Read, b.bucket)
		if err != nil {
			c.s.logger.Debug("reading a bucket's last revision for /metrics", "bucket", b.bucket, "err", err)
			continue
		}
		lag := 0.0
		if last > b.revision {
			lag = float64(last - b.revision)
		}
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, lag, b.bucket)
	}
}

// collectPlans reports the plans writer's stats data; nothing when the
// service reports none.
func collectPlans(ch chan<- prometheus.Metric, p *provisionerv1.PlansStats) {
	if p == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(descPlansWritten, prometheus.CounterValue, float64(p.GetWritten()))
	ch <- prometheus.MustNewConstMetric(descPlansComposed, prometheus.CounterValue, float64(p.GetComposed()))
	ch <- prometheus.MustNewConstMetric(descPlansFailed, prometheus.CounterValue, float64(p.GetFailed()))
	ch <- prometheus.MustNewConstMetric(descPlansPending, prometheus.GaugeValue, float64(p.GetPending()))
	ch <- prometheus.MustNewConstMetric(descPlansDeferred, prometheus.GaugeValue, float64(p.GetDeferred()))
	ch <- prometheus.MustNewConstMetric(descPlansLastPass, prometheus.GaugeValue, float64(p.GetLastPassMs())/1000)
	if at, err := time.Parse(time.RFC3339Nano, p.GetLastWritten()); err == nil {
		ch <- prometheus.MustNewConstMetric(descPlansLastWritten, prometheus.GaugeValue, float64(at.UnixNano())/1e9)
	}
}

// bucketState is one bucket's copy as a scrape reports it.
type bucketState struct {
	bucket         string
	revision       uint64
	loaded, behind bool
	malformed      uint64
	// counted says records and nodes are known: the stats data lists the
	// bucket.
	counted        bool
	records, nodes uint64
}

// bucketsOf returns every bucket the copy holds: those the stats data lists
// (the five provisioning buckets, the registry first), as $SRV.STATS
// reports them, then any other the service's Copies name. d may be nil.
func bucketsOf(d endpointData, copies []service.CopyState) []bucketState {
	var out []bucketState
	listed := map[string]bool{}
	for _, b := range d.GetBuckets() {
		listed[b.GetBucket()] = true
		out = append(out, bucketState{
			bucket:    b.GetBucket(),
			revision:  b.GetRevision(),
			loaded:    !slices.Contains(d.GetLoading(), b.GetBucket()),
			behind:    slices.Contains(d.GetBehind(), b.GetBucket()),
			malformed: b.GetMalformed(),
			counted:   true,
			records:   b.GetRecords(),
			nodes:     b.GetNodes(),
		})
	}
	for _, cp := range copies {
		if listed[cp.Bucket] {
			continue
		}
		out = append(out, bucketState{bucket: cp.Bucket, revision: cp.Revision, loaded: cp.Loaded, behind: cp.Behind, malformed: uint64(max(cp.Malformed, 0))})
	}
	return out
}

func boolValue(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// LastRevision returns the revision of the bucket's last write (0 for an
// empty bucket), asked as the server's permissions allow: a direct get of
// the last message on the bucket's keys, on the stream's own subject. The
// registry's stream holds the seat's lease too, which is not a key.
func LastRevision(ctx context.Context, nc *nats.Conn, bucket string) (uint64, error) {
	revision, _, err := lastWrite(ctx, nc, bucket)
	return revision, err
}

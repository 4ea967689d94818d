package ops

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
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
	{"errors_total", "Requests refused on arrival with an error: bad requests, the copy still loading, the queue full (micro's num_errors, and stats data refused for those sent on the answering connection).",
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
	{"dropped_total", "Requests of nodes and providers dropped unanswered where they arrived: their asker asked faster than --max-rate-per-asker, or than its requests were read (stats data dropped).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetDropped()) }},
	{"slow_consumer_total", "Times requests were dropped because the endpoint's pending buffer was full (stats data slow_consumer).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetSlowConsumer()) }},
	{"refused_replies_total", "Requests whose reply subject was refused, so no answer was sent (stats data refused_replies; 0 when the service does not report it).",
		func(_ *micro.EndpointStats, d endpointData) float64 { return float64(d.GetRefusedReplies()) }},
}

// endpointData is an endpoint's stats data.
type endpointData = *provisionerv1.EndpointStatsData

// initMetrics makes the registry: the Go runtime's and the process's
// collectors, the latency histograms and the service's own.
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
		"The revision the service's copy of the bucket has reached.", []string{"bucket"}, nil)
	descLag = prometheus.NewDesc(namespace+"_copy_lag_revisions",
		"The bucket's last write's revision minus the copy's revision; absent while NATS cannot be asked.", []string{"bucket"}, nil)
	descLoaded = prometheus.NewDesc(namespace+"_copy_loaded",
		"1 once the copy holds the bucket's initial values.", []string{"bucket"}, nil)
	descBehind = prometheus.NewDesc(namespace+"_copy_behind",
		"1 while the copy is known to lag the bucket (its watcher is catching up).", []string{"bucket"}, nil)
	descMalformed = prometheus.NewDesc(namespace+"_malformed_keys",
		"Keys of the bucket out of its shape, or over their node's budget, in the copy.", []string{"bucket"}, nil)
	descOverBudget = prometheus.NewDesc(namespace+"_nodes_over_budget",
		"Nodes over their budget (--node-max-keys, --node-max-bytes) in the bucket.", []string{"bucket"}, nil)
	descSeatHeld = prometheus.NewDesc(namespace+"_seat_held",
		"1 while this instance holds the provisioner seat, 0 while it stands by.", nil, nil)
	descSeatSince = prometheus.NewDesc(namespace+"_seat_since_timestamp_seconds",
		"Since when this instance holds the seat or stands by, in Unix seconds.", nil, nil)
	descReady = prometheus.NewDesc(namespace+"_ready",
		"1 while /readyz answers 200.", nil, nil)
	descDroppedBy = prometheus.NewDesc(namespace+"_asker_dropped_total",
		"Requests of one node or provider dropped unanswered where they arrived, for the ten askers with the most on each endpoint (stats data dropped_by_asker).",
		[]string{"endpoint", "role", "name"}, nil)
)

func descOf(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(namespace+"_"+name, help, []string{"endpoint"}, nil)
}

func (c *serviceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, m := range endpointCounters {
		ch <- descOf(m.name, m.help)
	}
	for _, d := range []*prometheus.Desc{descReused, descRevision, descLag, descLoaded, descBehind, descMalformed, descOverBudget, descSeatHeld, descSeatSince, descReady, descDroppedBy} {
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
		// The cache and the copy are the service's, whichever endpoint
		// reports them.
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
	}
	ctx, cancel := context.WithTimeout(context.Background(), min(c.s.cfg.Timeout, 2*time.Second))
	defer cancel()
	for _, cp := range t.Service.Copies() {
		ch <- prometheus.MustNewConstMetric(descRevision, prometheus.GaugeValue, float64(cp.Revision), cp.Bucket)
		ch <- prometheus.MustNewConstMetric(descLoaded, prometheus.GaugeValue, boolValue(cp.Loaded), cp.Bucket)
		ch <- prometheus.MustNewConstMetric(descBehind, prometheus.GaugeValue, boolValue(cp.Behind), cp.Bucket)
		ch <- prometheus.MustNewConstMetric(descMalformed, prometheus.GaugeValue, float64(cp.Malformed), cp.Bucket)
		if cp.Bucket != "mesh-provisioner_registry" {
			ch <- prometheus.MustNewConstMetric(descOverBudget, prometheus.GaugeValue, float64(overBudget[cp.Bucket]), cp.Bucket)
		}
		if t.Read == nil || !t.Read.IsConnected() {
			continue
		}
		last, err := LastRevision(ctx, t.Read, cp.Bucket)
		if err != nil {
			c.s.logger.Debug("reading a bucket's last revision for /metrics", "bucket", cp.Bucket, "err", err)
			continue
		}
		lag := 0.0
		if last > cp.Revision {
			lag = float64(last - cp.Revision)
		}
		ch <- prometheus.MustNewConstMetric(descLag, prometheus.GaugeValue, lag, cp.Bucket)
	}
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
	req, err := json.Marshal(map[string]string{"last_by_subj": wire.KVSubject(bucket, ">")})
	if err != nil {
		return 0, err
	}
	msg, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+wire.StreamOf(bucket), req)
	if err != nil {
		return 0, err
	}
	switch status := msg.Header.Get("Status"); status {
	case "":
	case "404":
		return 0, nil
	default:
		return 0, &directGetError{status: status, description: msg.Header.Get("Description")}
	}
	return strconv.ParseUint(msg.Header.Get("Nats-Sequence"), 10, 64)
}

type directGetError struct{ status, description string }

func (e *directGetError) Error() string {
	return "direct get: " + e.status + " " + e.description
}

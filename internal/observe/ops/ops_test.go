package ops_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/observe/ops"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url) //nolint:noctx // a test's short request
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = resp.Body.Close() }()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// value returns the value of metric name with the labels given (name=value
// pairs), summing histograms' counts; -1 when absent.
func value(families map[string]*dto.MetricFamily, name string, labels ...string) float64 {
	mf, ok := families[name]
	if !ok {
		return -1
	}
	total, found := 0.0, false
metrics:
	for _, m := range mf.GetMetric() {
		for i := 0; i < len(labels); i += 2 {
			match := false
			for _, l := range m.GetLabel() {
				if l.GetName() == labels[i] && l.GetValue() == labels[i+1] {
					match = true
				}
			}
			if !match {
				continue metrics
			}
		}
		found = true
		switch {
		case m.GetCounter() != nil:
			total += m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			total += m.GetGauge().GetValue()
		case m.GetHistogram() != nil:
			total += float64(m.GetHistogram().GetSampleCount())
		}
	}
	if !found {
		return -1
	}
	return total
}

// TestMetricsEqualMicroStats runs a script of requests (answers, reused
// answers, refusals on arrival, a 503 after a revision wait) and checks that
// /metrics passes promlint and says what $SRV.STATS says.
func TestMetricsEqualMicroStats(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	srv, err := ops.Start(ctx, ops.Config{Addr: "127.0.0.1:0", Token: []byte(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(ctx) })
	if code, body := get(t, srv.URL()+"/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "starting") {
		t.Errorf("/readyz before the service runs: %d %q, want 503 starting", code, body)
	}
	svc := servicetest.Start(t, nc, func(c *service.Config) {
		c.Observe = srv.Observer()
		c.RevisionWait = 100 * time.Millisecond
	})
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{nc}, Ask: nc, Read: nc})

	node, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := node.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true}); err != nil {
		t.Fatal(err)
	}
	last, err := servicetest.Bucket(t, nc, keys.NeedsBucket).Put(ctx, "ace.web.port", nil) // malformed: three tokens
	if err != nil {
		t.Fatal(err)
	}

	// The script.
	c := client.New(nc)
	for range 5 {
		if _, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last}); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		if _, err := c.Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"}); err != nil {
			t.Fatal(err)
		}
	}
	for _, body := range []string{`{"what":"WHAT_REGISTRY","node":"ace"}`, `not protobuf`, `{"what":"WHAT_NEEDS","node":"a b"}`} {
		msg, err := nc.Request(wire.ProvisioningSubject, []byte(body), 2*time.Second)
		if err != nil || msg.Header.Get(micro.ErrorCodeHeader) != "400" {
			t.Fatalf("%s: %v %v, want a 400", body, err, msg)
		}
	}
	if _, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_APPLIED, MinRevision: 1 << 40}); err == nil {
		t.Fatal("a revision never reached was answered")
	}

	var stats micro.Stats
	var families map[string]*dto.MetricFamily
	// micro counts a request once its callback returns, which may be just
	// after the answer arrived: the two agree once it has.
	natstest.CheckFor(t, 5*time.Second, func() error {
		msg, err := nc.Request("$SRV.STATS."+wire.ServiceName, nil, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(msg.Data, &stats); err != nil {
			t.Fatal(err)
		}
		code, _, text := request(t, srv.URL()+"/metrics", "", testToken)
		if code != http.StatusOK {
			t.Fatalf("/metrics: %d\n%s", code, text)
		}
		problems, err := promlint.New(strings.NewReader(text)).Lint()
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range problems {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
		parser := expfmt.NewTextParser(model.UTF8Validation)
		if families, err = parser.TextToMetricFamilies(strings.NewReader(text)); err != nil {
			t.Fatal(err)
		}
		var mismatch []string
		check := func(what string, got, want float64) {
			if got != want {
				mismatch = append(mismatch, fmt.Sprintf("%s: /metrics %v, $SRV.STATS %v", what, got, want))
			}
		}
		for _, e := range stats.Endpoints {
			var d struct {
				Answered       uint64 `json:"answered"`
				AnsweredEarly  uint64 `json:"answered_early"`
				AnswerErrors   uint64 `json:"answer_errors"`
				Shed           uint64 `json:"shed"`
				QueueFull      uint64 `json:"queue_full"`
				AskerFull      uint64 `json:"asker_full"`
				RefusedReplies uint64 `json:"refused_replies"`
				AnswerCache    struct {
					Hits uint64 `json:"hits"`
				} `json:"answer_cache"`
			}
			if err := json.Unmarshal(e.Data, &d); err != nil {
				t.Fatal(err)
			}
			ep := []string{"endpoint", e.Name}
			check(e.Name+" requests", value(families, "mesh_provisioner_requests_total", ep...), float64(e.NumRequests))
			check(e.Name+" errors", value(families, "mesh_provisioner_errors_total", ep...), float64(e.NumErrors))
			check(e.Name+" answered", value(families, "mesh_provisioner_answers_total", ep...), float64(d.Answered))
			check(e.Name+" answered early", value(families, "mesh_provisioner_answered_early_total", ep...), float64(d.AnsweredEarly))
			check(e.Name+" answer errors", value(families, "mesh_provisioner_answer_errors_total", ep...), float64(d.AnswerErrors))
			check(e.Name+" shed", value(families, "mesh_provisioner_shed_total", ep...), float64(d.Shed))
			check(e.Name+" queue full", value(families, "mesh_provisioner_queue_full_total", ep...), float64(d.QueueFull))
			check(e.Name+" asker full", value(families, "mesh_provisioner_asker_full_total", ep...), float64(d.AskerFull))
			check(e.Name+" refused replies", value(families, "mesh_provisioner_refused_replies_total", ep...), float64(d.RefusedReplies))
			// Every request is answered once: the histograms count them all.
			// An endpoint never asked has no series yet.
			check(e.Name+" latencies observed", max(value(families, "mesh_provisioner_request_duration_seconds", ep...), 0), float64(e.NumRequests))
			check("answers reused", value(families, "mesh_provisioner_answers_reused_total"), float64(d.AnswerCache.Hits))
		}
		if len(mismatch) > 0 {
			return errors.New(strings.Join(mismatch, "\n"))
		}
		return nil
	})
	// What the script did, as micro and /metrics both count it.
	for _, want := range []struct {
		name   string
		labels []string
		value  float64
	}{
		{"mesh_provisioner_requests_total", []string{"endpoint", "provisioning"}, 9},
		{"mesh_provisioner_requests_total", []string{"endpoint", "compose"}, 3},
		{"mesh_provisioner_errors_total", []string{"endpoint", "provisioning"}, 3},
		{"mesh_provisioner_answer_errors_total", []string{"endpoint", "provisioning"}, 1},
		{"mesh_provisioner_request_duration_seconds", []string{"endpoint", "provisioning", "code", "400"}, 3},
		{"mesh_provisioner_request_duration_seconds", []string{"endpoint", "provisioning", "code", "503"}, 1},
		{"mesh_provisioner_request_duration_seconds", []string{"endpoint", "compose", "code", "200"}, 3},
		{"mesh_provisioner_malformed_keys", []string{"bucket", keys.NeedsBucket}, 1},
		{"mesh_provisioner_copy_revision", []string{"bucket", keys.NeedsBucket}, float64(last)},
		{"mesh_provisioner_copy_lag_revisions", []string{"bucket", keys.NeedsBucket}, 0},
		{"mesh_provisioner_ready", nil, 1},
	} {
		if got := value(families, want.name, want.labels...); got != want.value {
			t.Errorf("%s%v = %v, want %v", want.name, want.labels, got, want.value)
		}
	}
	if got := value(families, "mesh_provisioner_answers_reused_total"); got < 4 {
		t.Errorf("answers reused %v, want at least 4 of the 5 same requests", got)
	}
}

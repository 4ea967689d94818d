package ops_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/observe/ops"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// exercised is a service on a real NATS, with an HTTP server for it, made
// to report every series /metrics has: ace's need and manifest in the copy,
// the plans writer's digest of ace written, the seat held, a flooding node's
// requests dropped, answers timed and a permission violation counted.
type exercised struct {
	srv *ops.Server
	nc  *nats.Conn
}

func exercise(t *testing.T) exercised {
	t.Helper()
	ctx := t.Context()
	// Partitioned, so that the flood shuts its partition out too.
	nc := natstest.Connect(t, natstest.StartWithConfig(t, permissions.MappingsConfig(2)))
	srv, err := ops.Start(context.WithoutCancel(ctx), ops.Config{Addr: "127.0.0.1:0", Token: []byte(testToken), Version: "1.2.3"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	since := time.Now().Add(-time.Minute)
	svc := servicetest.Start(t, nc, func(c *service.Config) {
		c.Observe = srv.Observer()
		c.Seat = func() (bool, time.Time, string) { return true, since, "this" }
		c.MaxRatePerAsker = 1 // the flooding node's burst is one request
		c.Partitions = 2
	})
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{nc}, Ask: nc, Read: nc})
	servicetest.RunPlans(t, svc, nc, 10*time.Millisecond)

	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ace.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ace.PutManifest(ctx, "pg", &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}}); err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(nc).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace"}); err != nil {
		t.Fatal(err)
	}
	body, err := proto.Marshal(&provisionerv1.ComposeRequest{Node: "flood"})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 500 { // past the 101 drops that shut a partition out
		if err := nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "flood"), fmt.Sprintf("%s.gone.%d", wire.InboxPrefix(wire.RoleNode, "flood"), i), body); err != nil {
			t.Fatal(err)
		}
	}
	srv.CountRefusal(wire.ServerIdentity)
	return exercised{srv: srv, nc: nc}
}

// gather gathers the server's registry once the plans writer has written
// ace's digest, the copy holds ace's manifest and the flood is dropped.
func (x exercised) gather(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	var families map[string]*dto.MetricFamily
	natstest.CheckFor(t, 10*time.Second, func() error {
		got, err := ops.Gatherer(x.srv).Gather()
		if err != nil {
			t.Fatal(err)
		}
		families = map[string]*dto.MetricFamily{}
		for _, mf := range got {
			families[mf.GetName()] = mf
		}
		switch {
		case value(families, "mesh_provisioner_plans_written_total") < 1:
			return errors.New("the plans writer wrote no digest yet")
		case value(families, "mesh_provisioner_copy_records", "bucket", keys.ManifestsBucket) < 1:
			return errors.New("the copy holds no manifest yet")
		case value(families, "mesh_provisioner_asker_dropped_total", "name", "flood") < 1:
			return errors.New("no request of the flood dropped yet")
		case value(families, "mesh_provisioner_partition_shut_outs_total", "partition", strconv.Itoa(wire.PartitionOf("flood", 2))) < 1:
			return errors.New("the flood's partition is not shut out yet")
		}
		return nil
	})
	return families
}

// TestMetricsPassTheLinterAndCoverTheService scrapes a service that has
// done everything /metrics reports: client_golang's linter finds no problem
// in the registry, nor in the service's collector alone on a pedantic
// registry (every series described), and the build, every bucket of the
// copy (the manifests' too), its records and nodes, and the plans writer
// are there, as $SRV.STATS says them.
func TestMetricsPassTheLinterAndCoverTheService(t *testing.T) {
	t.Parallel()
	x := exercise(t)
	families := x.gather(t)

	problems, err := testutil.GatherAndLint(ops.Gatherer(x.srv))
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Errorf("lint of the registry: %s: %s", p.Metric, p.Text)
	}
	pedantic := prometheus.NewPedanticRegistry()
	if err := pedantic.Register(ops.ServiceCollector(x.srv)); err != nil {
		t.Fatal(err)
	}
	if problems, err = testutil.GatherAndLint(pedantic); err != nil {
		t.Fatal(err) // a series the collector does not describe
	}
	for _, p := range problems {
		t.Errorf("lint of the service's collector: %s: %s", p.Metric, p.Text)
	}

	if got := value(families, "mesh_provisioner_build_info", "version", "1.2.3", "goversion", runtime.Version()); got != 1 {
		t.Errorf("mesh_provisioner_build_info{version=1.2.3,goversion=%s} = %v, want 1", runtime.Version(), got)
	}
	if mf := families["mesh_provisioner_build_info"]; len(mf.GetMetric()) != 1 || !slices.ContainsFunc(mf.GetMetric()[0].GetLabel(), func(l *dto.LabelPair) bool {
		return l.GetName() == "revision" && l.GetValue() != ""
	}) {
		t.Errorf("mesh_provisioner_build_info %v, want one series with a revision", mf.GetMetric())
	}

	// Every bucket of the copy, as the stats data reports it.
	msg, err := x.nc.Request("$SRV.STATS."+wire.ServiceName, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	stats, err := decodeStats(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	data, err := wire.DecodeStatsData(stats.Endpoints[0].Data)
	if err != nil {
		t.Fatal(err)
	}
	var listed []string
	for _, b := range data.GetBuckets() {
		listed = append(listed, b.GetBucket())
		bucket := []string{"bucket", b.GetBucket()}
		for _, want := range []struct {
			name  string
			value float64
		}{
			{"mesh_provisioner_copy_revision", float64(b.GetRevision())},
			{"mesh_provisioner_copy_records", float64(b.GetRecords())},
			{"mesh_provisioner_copy_nodes", float64(b.GetNodes())},
			{"mesh_provisioner_malformed_keys", float64(b.GetMalformed())},
			{"mesh_provisioner_copy_loaded", 1},
			{"mesh_provisioner_copy_behind", 0},
			{"mesh_provisioner_copy_lag_revisions", 0},
		} {
			if got := value(families, want.name, bucket...); got != want.value {
				t.Errorf("%s{bucket=%q} = %v, want %v", want.name, b.GetBucket(), got, want.value)
			}
		}
		want := 0.0 // no node over its budget
		if b.GetBucket() == keys.RegistryBucket {
			want = -1 // the registry has no nodes' budget: no series
		}
		if got := value(families, "mesh_provisioner_nodes_over_budget", bucket...); got != want {
			t.Errorf("mesh_provisioner_nodes_over_budget{bucket=%q} = %v, want %v", b.GetBucket(), got, want)
		}
	}
	if !slices.Equal(listed, keys.Buckets()) {
		t.Errorf("stats data buckets %v, want %v", listed, keys.Buckets())
	}
	for _, bucket := range []string{keys.NeedsBucket, keys.ManifestsBucket} {
		if got := value(families, "mesh_provisioner_copy_records", "bucket", bucket); got != 1 {
			t.Errorf("%s records %v, want ace's one", bucket, got)
		}
		if got := value(families, "mesh_provisioner_copy_nodes", "bucket", bucket); got != 1 {
			t.Errorf("%s nodes %v, want ace", bucket, got)
		}
	}

	// The plans writer.
	plans := data.GetPlans()
	if got := value(families, "mesh_provisioner_plans_composed_total"); got < 1 {
		t.Errorf("plans composed %v, want at least ace's", got)
	}
	for _, want := range []struct {
		name  string
		value float64
	}{
		{"mesh_provisioner_plans_written_total", float64(plans.GetWritten())},
		{"mesh_provisioner_plans_failed_total", float64(plans.GetFailed())},
		{"mesh_provisioner_plans_pending", float64(plans.GetPending())},
		{"mesh_provisioner_plans_deferred", float64(plans.GetDeferred())},
		{"mesh_provisioner_plans_last_pass_duration_seconds", float64(plans.GetLastPassMs()) / 1000},
	} {
		if got := value(families, want.name); got != want.value {
			t.Errorf("%s = %v, want %v as $SRV.STATS says", want.name, got, want.value)
		}
	}
	lastWritten, err := time.Parse(time.RFC3339Nano, plans.GetLastWritten())
	if err != nil {
		t.Fatalf("stats data plans.last_written %q: %v", plans.GetLastWritten(), err)
	}
	if got, want := value(families, "mesh_provisioner_plans_last_written_timestamp_seconds"), float64(lastWritten.UnixNano())/1e9; got != want {
		t.Errorf("plans last written %v, want %v", got, want)
	}

	// The text /metrics serves says the same.
	code, _, text := request(t, x.srv.URL()+"/metrics", "", testToken)
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d\n%s", code, text)
	}
	for _, want := range []string{
		`mesh_provisioner_build_info{goversion="` + runtime.Version() + `",revision="`,
		`mesh_provisioner_copy_records{bucket="` + keys.ManifestsBucket + `"} 1`,
		`mesh_provisioner_copy_nodes{bucket="` + keys.ManifestsBucket + `"} 1`,
		"# TYPE mesh_provisioner_plans_written_total counter",
		"# TYPE mesh_provisioner_plans_pending gauge",
		"# TYPE mesh_provisioner_plans_last_pass_duration_seconds gauge",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("/metrics has no %s", want)
		}
	}
}

// TestMetricsAsTheDeployDocListsThem: docs/deploy.md's tables of metrics
// list exactly the mesh_provisioner_ series /metrics serves, each with its
// type.
func TestMetricsAsTheDeployDocListsThem(t *testing.T) {
	t.Parallel()
	families := exercise(t).gather(t)
	served := map[string]string{}
	for name, mf := range families {
		if strings.HasPrefix(name, "mesh_provisioner_") {
			served[name] = strings.ToLower(mf.GetType().String())
		}
	}
	listed, err := deployDocMetrics("../../../docs/deploy.md")
	if err != nil {
		t.Fatal(err)
	}
	for name, typ := range served {
		switch doc, ok := listed[name]; {
		case !ok:
			t.Errorf("docs/deploy.md does not list %s (%s)", name, typ)
		case doc != typ:
			t.Errorf("docs/deploy.md says %s is a %s; /metrics serves a %s", name, doc, typ)
		}
	}
	for name := range listed {
		if _, ok := served[name]; !ok {
			t.Errorf("docs/deploy.md lists %s, which /metrics does not serve", name)
		}
	}
}

// deployDocMetrics reads the rows "| `name` | type | meaning |" of the
// section "## Metrics" of the deploy doc at path.
func deployDocMetrics(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	listed := map[string]string{}
	in := false
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "## ") {
			in = line == "## Metrics"
			continue
		}
		if !in || !strings.HasPrefix(line, "| `mesh_provisioner_") {
			continue
		}
		cells := strings.Split(line, "|")
		if len(cells) < 4 {
			return nil, fmt.Errorf("%s: row %q has no type", path, line)
		}
		name, typ := strings.Trim(strings.TrimSpace(cells[1]), "`"), strings.TrimSpace(cells[2])
		if _, dup := listed[name]; dup {
			return nil, fmt.Errorf("%s lists %s twice", path, name)
		}
		listed[name] = typ
	}
	if len(listed) == 0 {
		return nil, fmt.Errorf("%s has no table of metrics under ## Metrics", path)
	}
	return listed, sc.Err()
}

// decodeStats decodes a $SRV.STATS reply.
func decodeStats(raw []byte) (micro.Stats, error) {
	var stats micro.Stats
	err := json.Unmarshal(raw, &stats)
	return stats, err
}

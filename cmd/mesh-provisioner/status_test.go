package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/observe/meshstatus"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

func TestStatus(t *testing.T) {
	t.Parallel()
	url := queryMesh(t)
	tests := []struct {
		golden string
		args   []string
	}{
		{"status", nil},
		{"status_records", []string{"--records"}},
		{"status_compose_one", []string{"--records", "--compose-nodes", "1"}},
	}
	for _, tt := range tests {
		t.Run(tt.golden, func(t *testing.T) {
			t.Parallel()
			var out, errOut bytes.Buffer
			if err := run(context.Background(), append([]string{"status", "--json", "--nats-url", url}, tt.args...), &out, &errOut); err != nil {
				t.Fatalf("status: %v\n%s", err, errOut.String())
			}
			var report statusReport
			if err := json.Unmarshal(out.Bytes(), &report); err != nil {
				t.Fatalf("--json does not decode: %v\n%s", err, out.String())
			}
			if len(report.Instances) != 1 {
				t.Fatalf("%d instances, want the one serving", len(report.Instances))
			}
			in := &report.Instances[0]
			if len(in.ID) == 0 || in.Version != "1.2.3" || time.Since(in.Started) > time.Minute || len(in.Endpoints) != 10 {
				t.Errorf("instance %+v, want an id, version 1.2.3, started just now and ten endpoints", in)
			}
			// What changes from run to run is set aside; the rest is golden.
			in.ID, in.Started = "<id>", time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
			if in.Seat != "standby" || in.SeatSince == "" {
				t.Errorf("instance's seat %q since %q, want standby (servicetest's instance does not contend) since a time", in.Seat, in.SeatSince)
			}
			in.SeatSince = "2026-01-02T03:04:05Z"
			for i := range in.Endpoints {
				e := &in.Endpoints[i]
				if e.Requests == 0 && e.Name == "provisioning" {
					t.Errorf("the provisioning endpoint counted no requests: %+v", e)
				}
				e.Requests, e.Errors, e.Answered, e.AnswerErrors, e.AverageDuration = 0, 0, 0, 0, 0
			}
			var text bytes.Buffer
			if err := printStatus(&text, &report); err != nil {
				t.Fatal(err)
			}
			golden := filepath.Join("testdata", tt.golden+".golden")
			if *update {
				if err := os.WriteFile(golden, text.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test ./cmd/mesh-provisioner -run TestStatus -update)", err)
			}
			if diff := cmp.Diff(string(want), text.String()); diff != "" {
				t.Errorf("status (-golden +got):\n%s", diff)
			}
		})
	}

	t.Run("as text", func(t *testing.T) {
		t.Parallel()
		var out bytes.Buffer
		if err := run(context.Background(), []string{"status", "--nats-url", url}, &out, &bytes.Buffer{}); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"Instances (1) serving mesh-provisioner\n", "\nBuckets (", "mesh-provisioner_needs ", "\nNodes (2) with 6 needs\n", "\nMalformed keys (2)\n"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("status does not say %q:\n%s", want, out.String())
			}
		}
	})
}

func TestStatusShowsTheSeat(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, data, seat string
	}{
		{"held", `{"answered":3,"loading":[],"behind":["mesh-provisioner_needs"],"seat":"held","seat_since":"2026-01-02T03:04:05Z"}`, "held since 2026-01-02T03:04:05Z"},
		{"standby", `{"seat":"standby"}`, "standby"},
		{"standby, the holder known", `{"seat":"standby","seat_holder":"XYZ"}`, "standby (held by XYZ)"},
		{"no seat reported", `{"answered":3,"loading":[],"behind":[]}`, "-"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			in := meshstatus.InstanceOf(micro.Stats{ServiceIdentity: micro.ServiceIdentity{ID: "abc", Version: "1.2.3"},
				Endpoints: []*micro.EndpointStats{{Name: "provisioning", Data: json.RawMessage(tt.data)}}})
			var out bytes.Buffer
			if err := printStatus(&out, &statusReport{Instances: []instanceStatus{in}}); err != nil {
				t.Fatal(err)
			}
			row := strings.Split(out.String(), "\n")[2]
			// ID, VERSION, STARTED, then SEAT.
			if fields := strings.Fields(row); len(fields) < 4 || fields[3] != strings.Fields(tt.seat)[0] || !strings.Contains(row, " "+tt.seat+" ") {
				t.Errorf("instance row %q does not show seat %q", row, tt.seat)
			}
		})
	}
}

func TestStatusShowsNodesOverBudget(t *testing.T) {
	t.Parallel()
	data := `{"answered":3,"over_budget":[{"bucket":"mesh-provisioner_needs","node":"ace","keys":10000,"bytes":4000000,"refused":250}]}`
	in := meshstatus.InstanceOf(micro.Stats{ServiceIdentity: micro.ServiceIdentity{ID: "abc", Version: "1.2.3"},
		Endpoints: []*micro.EndpointStats{{Name: "provisioning", Data: json.RawMessage(data)}, {Name: "compose", Data: json.RawMessage(data)}}})
	var out bytes.Buffer
	if err := printStatus(&out, &statusReport{Instances: []instanceStatus{in}}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "Nodes over their budget in the copy of abc (1)") ||
		!regexp.MustCompile(`mesh-provisioner_needs\s+ace\s+10000\s+4000000\s+250`).MatchString(out.String()) {
		t.Errorf("status does not show ace over its budget:\n%s", out.String())
	}
}

// status reads no record, however many the mesh holds: it sends one
// $SRV.STATS, and for each bucket its stream's info and last message; no
// request to a verb, no consumer, no other read of a stream. A subscription
// to every subject, as an unrestricted user, counts what it sends (by its
// inbox prefix) and any request to a verb, and the service's own stats
// that its endpoints were not asked.
func TestStatusReadsNoRecords(t *testing.T) {
	t.Parallel()
	const nodes, needsEach = 40, 50
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	svc := servicetest.Start(t, nc)
	ctx := t.Context()
	value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	if err != nil {
		t.Fatal(err)
	}
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	var last uint64
	for n := range nodes {
		for i := range needsEach {
			if last, err = needs.Put(ctx, fmt.Sprintf("n%03d.web.port.p%03d", n, i), value); err != nil {
				t.Fatal(err)
			}
		}
	}
	// The copy holds every write before anything is counted.
	if _, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last, PageSize: 1}); err != nil {
		t.Fatal(err)
	}
	requests := func() (n int) {
		for _, e := range svc.Stats().Endpoints {
			n += e.NumRequests
		}
		return n
	}
	// micro counts a request once its handler returns, which may be after
	// its answer arrived: wait for the one asked above.
	natstest.CheckFor(t, 5*time.Second, func() error {
		if requests() == 0 {
			return errors.New("the provisioning request is not counted yet")
		}
		return nil
	})
	before := requests()

	spy := natstest.Connect(t, s)
	sub, err := spy.SubscribeSync(">")
	if err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	var out, errOut bytes.Buffer
	// Status's own inbox prefix tells its requests from the service's own
	// (its watchers ask for stream info too).
	const inbox = "_INBOX_STATUS_TEST"
	if err := run(ctx, []string{"status", "--json", "--discovery-wait", "200ms", "--inbox-prefix", inbox, "--nats-url", s.ClientURL()}, &out, &errOut); err != nil {
		t.Fatalf("status: %v\n%s", err, errOut.String())
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for {
		msg, err := sub.NextMsg(0)
		if err != nil {
			break
		}
		switch subject := msg.Subject; {
		case strings.HasPrefix(subject, wire.ServiceName+"."):
			counts["a verb: "+subject]++ // whoever asked: nothing else does here
		case !strings.HasPrefix(msg.Reply, inbox+"."):
			// not status's
		case strings.HasPrefix(subject, "$SRV."):
			counts[subject]++
		case strings.HasPrefix(subject, "$JS.API.STREAM.INFO."):
			counts["stream info"]++
		case strings.HasPrefix(subject, "$JS.API.DIRECT.GET."), strings.HasPrefix(subject, "$JS.API.STREAM.MSG.GET."):
			counts["message get"]++
		case strings.HasPrefix(subject, "$JS.API."):
			counts["other JetStream API: "+subject]++
		}
	}
	buckets := len(keys.Buckets())
	want := map[string]int{"$SRV.STATS." + wire.ServiceName: 1, "stream info": buckets, "message get": buckets}
	if diff := cmp.Diff(want, counts); diff != "" {
		t.Errorf("what status sent (-want +got):\n%s", diff)
	}
	if after := requests(); after != before {
		t.Errorf("the service's endpoints counted %d requests during status, want none", after-before)
	}
	var report statusReport
	if err := json.Unmarshal(out.Bytes(), &report); err != nil {
		t.Fatalf("--json does not decode: %v\n%s", err, out.String())
	}
	for _, b := range report.Buckets {
		if b.Bucket == keys.NeedsBucket && (b.Records != nodes*needsEach || b.Nodes != nodes || b.CopyAt != last || b.Lag != 0) {
			t.Errorf("needs bucket %+v, want %d records of %d nodes at revision %d, no lag", b, nodes*needsEach, nodes, last)
		}
	}
	if report.Needs != nodes*needsEach || report.Refusals.NodesTotal != nodes {
		t.Errorf("report counts %d needs of %d nodes, want %d of %d", report.Needs, report.Refusals.NodesTotal, nodes*needsEach, nodes)
	}
}

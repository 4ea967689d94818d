package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// A node that floods its own subject, with exactly its grant on a server
// whose users are the generated permission sets, loses its excess where it
// arrives: the service answers another node's every request meanwhile, and
// names the flooding node in its stats, its metrics and one log line.
// Before the door, every asker's requests waited in one buffer, and the
// flood's drops were nobody's (stats data had no dropped).
func TestAFloodingNodeLosesItsOwnExcess(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	host := strings.TrimPrefix(s.ClientURL(), "nats://")
	tokenFile, token := writeTokenFile(t)
	page := statusPage{base: "http://127.0.0.1:" + strconv.Itoa(freePort(t)), token: token}
	const rate = 200 // a second: ace's flood is far past it
	sv := serveInProcess(t, []string{
		"--nats-url", "nats://mesh-provisioner:mesh-provisioner-secret@" + host,
		"--writer-nats-url", "nats://mesh-provisioner-writer:mesh-provisioner-writer-secret@" + host,
		"--state-dir", t.TempDir(), "--log-format", "json", "--max-rate-per-asker", strconv.Itoa(rate),
		"--http", strings.TrimPrefix(page.base, "http://"), "--http-token-file", tokenFile,
	}, nil)
	sv.log.waitFor(t, `"msg":"serving"`, 20*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()

	ace := connectAs(t, s, wire.RoleNode, "ace")
	// ace hears what it is answered: what passes the door, and why the
	// rest does not, once a second.
	heard, err := ace.nc.SubscribeSync(wire.InboxPrefix(wire.RoleNode, "ace") + ".gone.>")
	if err != nil {
		t.Fatal(err)
	}
	flooded := time.Now()
	const flood = 5_000
	body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: "ace"})
	for i := range flood {
		// Its own subject, and a reply in its own inbox that it does
		// not read: every check but the door's passes.
		if err := ace.nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), fmt.Sprintf("%s.gone.%d", wire.InboxPrefix(wire.RoleNode, "ace"), i), body); err != nil {
			t.Fatal(err)
		}
	}
	if err := ace.nc.FlushWithContext(ctx); err != nil {
		t.Fatal(err)
	}
	novox := client.New(connectAs(t, s, wire.RoleNode, "novox").nc, client.AsNode("novox"))
	for i := range 20 {
		if _, err := novox.Compose(ctx, &provisionerv1.ComposeRequest{Node: "novox"}); err != nil {
			t.Fatalf("novox's compose %d: %v", i, err)
		}
	}

	// Of its dropped requests, ace is told why at most once a second.
	var told int
	for {
		msg, err := heard.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		if reason := msg.Header.Get(wire.ErrorHeader); reason != "" {
			if !strings.Contains(reason, "more than 200 times a second") || msg.Header.Get(wire.ErrorCodeHeader) != "503" {
				t.Errorf("ace is told %s %q, want a 503 that names its rate", msg.Header.Get(wire.ErrorCodeHeader), reason)
			}
			told++
		}
	}
	if most := int(time.Since(flooded).Seconds()) + 1; told < 1 || told > most {
		t.Errorf("ace was told why its requests were dropped %d times in %s, want 1 to %d", told, time.Since(flooded).Round(time.Millisecond), most)
	}

	ops := connectAs(t, s, wire.RoleOperator, "ops")
	var data *provisionerv1.EndpointStatsData
	for _, e := range endpointStats(t, ops.nc) {
		if e.Name == wire.ComposeNodeEndpoint {
			if data, _ = wire.DecodeStatsData(e.Data); data == nil {
				t.Fatalf("the %s endpoint's stats data %s does not decode", e.Name, e.Data)
			}
		}
	}
	// ace's first second's worth passes (the burst), and a few refills
	// while the flood is read: the rest is dropped.
	if data.GetDropped() < flood-5*rate {
		t.Errorf("%d of ace's %d requests dropped, want at least %d", data.GetDropped(), flood, flood-5*rate)
	}
	if got := data.GetDroppedByAsker(); len(got) != 1 || got[0].GetName() != "ace" || got[0].GetRole() != "node" || got[0].GetDropped() != data.GetDropped() {
		t.Errorf("dropped by asker %v, want ace's %d alone", got, data.GetDropped())
	}
	code, metrics := page.get(t, "/metrics")
	want := fmt.Sprintf(`mesh_provisioner_asker_dropped_total{endpoint=%q,name="ace",role="node"} %d`, wire.ComposeNodeEndpoint, data.GetDropped())
	if code != 200 || !strings.Contains(metrics, want) {
		t.Errorf("/metrics (%d) has no line %s", code, want)
	}
	if n := strings.Count(sv.log.String(), "dropped unanswered"); n != 1 {
		t.Errorf("%d log lines of dropped requests, want 1:\n%s", n, sv.log.String())
	}
}

// endpointStats asks the service's $SRV.STATS as asker's identity.
// In a partitioned mesh, a node that floods its own subject has its
// partition shut out: the service unsubscribes the partition's subjects
// for a while, so that nats-server drops the flood unsent, and another
// partition's node is answered throughout. A node of the flooder's
// partition hears "no responders" meanwhile, and is answered again once
// the flood stops; the stats, the metrics and one log line name the
// partition and the flooder. A door alone reads the whole flood, which
// takes the cores from every asker (make bench-fair).
func TestAFloodingNodesPartitionIsShutOutAlone(t *testing.T) {
	t.Parallel()
	const partitions = 8
	s := authorizedPartitionedServer(t, partitions)
	host := strings.TrimPrefix(s.ClientURL(), "nats://")
	tokenFile, token := writeTokenFile(t)
	page := statusPage{base: "http://127.0.0.1:" + strconv.Itoa(freePort(t)), token: token}
	sv := serveInProcess(t, []string{
		"--nats-url", "nats://mesh-provisioner:mesh-provisioner-secret@" + host,
		"--writer-nats-url", "nats://mesh-provisioner-writer:mesh-provisioner-writer-secret@" + host,
		"--state-dir", t.TempDir(), "--log-format", "json", "--max-rate-per-asker", "200", "--partitions", strconv.Itoa(partitions),
		"--http", strings.TrimPrefix(page.base, "http://"), "--http-token-file", tokenFile,
	}, nil)
	sv.log.waitFor(t, `"msg":"serving"`, 20*time.Second)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	flooded := wire.PartitionOf("ace", partitions)
	if wire.PartitionOf("novox", partitions) == flooded {
		t.Fatal("novox shares ace's partition: choose another count")
	}
	// A node of ace's partition, asked of by admin in its name.
	mate := ""
	for i := 0; mate == ""; i++ {
		if name := "mate" + strconv.Itoa(i); wire.PartitionOf(name, partitions) == flooded {
			mate = name
		}
	}
	admin := connectAs(t, s, wire.RoleNode, "admin")
	askMate := func() error {
		body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: mate})
		msg := nats.NewMsg(wire.NodeSubject(wire.ComposeSubject, mate))
		msg.Data = body
		inbox := wire.InboxPrefix(wire.RoleNode, mate) + "." + nats.NewInbox()[len("_INBOX."):]
		sub, err := admin.nc.SubscribeSync(inbox)
		if err != nil {
			return err
		}
		defer func() { _ = sub.Unsubscribe() }()
		msg.Reply = inbox
		msg.Header = nats.Header{}
		if err := admin.nc.PublishMsg(msg); err != nil {
			return err
		}
		answer, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			return err
		}
		if answer.Header.Get("Status") == "503" && len(answer.Data) == 0 {
			return nats.ErrNoResponders
		}
		return nil
	}
	if err := askMate(); err != nil {
		t.Fatalf("%s, of ace's partition, before the flood: %v", mate, err)
	}

	ace := connectAs(t, s, wire.RoleNode, "ace")
	// ace's grant names its own partition's subjects: nats-server maps
	// before it checks, so ace floods neither novox's subject nor its own
	// name in novox's partition.
	into := wire.NodeSubject(wire.ComposeSubject, "ace") + "." + strconv.Itoa(wire.PartitionOf("novox", partitions))
	for _, subject := range []string{into, wire.NodeSubject(wire.ComposeSubject, "novox")} {
		if err := ace.nc.Publish(subject, nil); err != nil {
			t.Fatal(err)
		}
		if !ace.violated(wire.PartitionedSubject(subject, partitions)) {
			t.Errorf("ace published to %s unrefused", subject)
		}
	}
	flood, stopFlood := context.WithCancel(ctx)
	defer stopFlood()
	floodDone := make(chan struct{})
	go func() {
		defer close(floodDone)
		body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: "ace"})
		gone := wire.InboxPrefix(wire.RoleNode, "ace") + ".gone"
		for flood.Err() == nil {
			for range 1000 {
				_ = ace.nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), gone, body)
			}
			_ = ace.nc.FlushWithContext(flood)
		}
	}()
	novox := client.New(connectAs(t, s, wire.RoleNode, "novox").nc, client.AsNode("novox"))
	natstest.CheckFor(t, 20*time.Second, func() error {
		if err := askMate(); !errors.Is(err, nats.ErrNoResponders) {
			return fmt.Errorf("%s, of ace's partition, during the flood: %w, want no responders", mate, err)
		}
		return nil
	})
	for i := range 20 {
		if _, err := novox.Compose(ctx, &provisionerv1.ComposeRequest{Node: "novox"}); err != nil {
			t.Fatalf("novox's compose %d during the flood: %v", i, err)
		}
	}
	stopFlood()
	<-floodDone

	ops := connectAs(t, s, wire.RoleOperator, "ops")
	data, _ := wire.DecodeStatsData(endpointStats(t, ops.nc)[0].Data)
	if got := data.GetShutOut(); len(got) != 1 || got[0].GetPartition() != uint32(flooded) || got[0].GetAsker() != "ace" || got[0].GetTimes() < 1 {
		t.Errorf("shut out %v, want partition %d alone, for ace", got, flooded)
	}
	code, metrics := page.get(t, "/metrics")
	if want := fmt.Sprintf(`mesh_provisioner_partition_shut_outs_total{partition="%d"}`, flooded); code != 200 || !strings.Contains(metrics, want) {
		t.Errorf("/metrics (%d) has no line %s", code, want)
	}
	if n := strings.Count(sv.log.String(), "its partition's subjects are unsubscribed for a while"); n != 1 {
		t.Errorf("%d log lines of a partition shut out, want 1:\n%s", n, sv.log.String())
	}
	// The pause ends, and the flood with it: the partition is answered.
	natstest.CheckFor(t, 30*time.Second, func() error { return askMate() })
}

func endpointStats(t *testing.T, asker *nats.Conn) []*micro.EndpointStats {
	t.Helper()
	subject, _ := micro.ControlSubject(micro.StatsVerb, wire.ServiceName, "")
	reply, err := asker.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(reply.Data, &stats); err != nil {
		t.Fatal(err)
	}
	return stats.Endpoints
}

// Every refusal the service sends on the micro callback is counted by
// micro as its own Error counts one: a garbage request's 400 shows in `nats
// micro stats` as num_errors and last_error, on an operator's endpoint and
// on a node's (behind its door, the request is read and refused on the
// callback, before it waits in its line).
func TestMicroStatsCountRefusals(t *testing.T) {
	t.Parallel()
	natsBin := os.Getenv(natsBinVariable)
	if natsBin == "" {
		t.Skipf("$%s is not set (make test-go sets it)", natsBinVariable)
	}
	s := authorizedServer(t)
	host := strings.TrimPrefix(s.ClientURL(), "nats://")
	sv := serveInProcess(t, []string{
		"--nats-url", "nats://mesh-provisioner:mesh-provisioner-secret@" + host,
		"--writer-nats-url", "nats://mesh-provisioner-writer:mesh-provisioner-writer-secret@" + host,
		"--state-dir", t.TempDir(), "--log-format", "json",
	}, nil)
	sv.log.waitFor(t, `"msg":"serving"`, 20*time.Second)
	garbage := []byte{0xff, 0xff, 0xff}
	for _, ask := range []struct {
		identity *identity
		subject  string
	}{
		{connectAs(t, s, wire.RoleOperator, "ops"), wire.ComposeSubject},
		{connectAs(t, s, wire.RoleNode, "ace"), wire.NodeSubject(wire.ComposeSubject, "ace")},
	} {
		reply, err := ask.identity.nc.Request(ask.subject, garbage, 5*time.Second)
		if err != nil {
			t.Fatalf("garbage on %s: %v", ask.subject, err)
		}
		if code := reply.Header.Get(wire.ErrorCodeHeader); code != "400" {
			t.Fatalf("garbage on %s: answered %q, want a 400", ask.subject, code)
		}
	}
	out, err := exec.CommandContext(t.Context(), natsBin, "--server", "nats://admin:admin-secret@"+host, "micro", "stats", wire.ServiceName, "--json").Output()
	if err != nil {
		t.Fatalf("nats micro stats: %v\n%s", err, out)
	}
	var stats []micro.Stats
	if err := json.Unmarshal(out, &stats); err != nil {
		var one micro.Stats
		if err := json.Unmarshal(out, &one); err != nil {
			t.Fatalf("nats micro stats --json: %v\n%s", err, out)
		}
		stats = []micro.Stats{one}
	}
	for _, name := range []string{wire.ComposeEndpoint, wire.ComposeNodeEndpoint} {
		var errors int
		var last string
		for _, st := range stats {
			for _, e := range st.Endpoints {
				if e.Name == name {
					errors += e.NumErrors
					last = e.LastError
				}
			}
		}
		if errors != 1 || !strings.Contains(last, "400") {
			t.Errorf("nats micro stats: endpoint %s num_errors %d, last_error %q; want 1, and the 400", name, errors, last)
		}
	}
}

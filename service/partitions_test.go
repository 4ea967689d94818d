package service_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// A partition shut out is named for the asker that flooded it: a later
// flooder of the same partition by its own name. The endpoints' micro
// counts, folded over the partitions, never go back when a partition's
// instance stops (a Prometheus counter would read that as a reset).
func TestAPartitionShutOutNamesItsFlooder(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.StartWithConfig(t, permissions.MappingsConfig(2)))
	svc := servicetest.Start(t, nc, func(c *service.Config) { c.Partitions, c.MaxRatePerAsker = 2, 1 })
	var names []string // two nodes of partition 0
	for i := 0; len(names) < 2; i++ {
		if name := fmt.Sprintf("n%d", i); wire.PartitionOf(name, 2) == 0 {
			names = append(names, name)
		}
	}
	flood := func(name string) {
		body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: name})
		for range 2_000 {
			if err := nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, name), wire.InboxPrefix(wire.RoleNode, name)+".gone", body); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	var requests int // compose-node's, as Stats last said
	shutOut := func() *provisionerv1.PartitionShutOut {
		t.Helper()
		var out *provisionerv1.PartitionShutOut
		for _, e := range svc.Stats().Endpoints {
			if e.Name != wire.ComposeNodeEndpoint {
				continue
			}
			if e.NumRequests < requests {
				t.Fatalf("compose-node's requests went back from %d to %d", requests, e.NumRequests)
			}
			requests = e.NumRequests
			data, _ := wire.DecodeStatsData(e.Data)
			for _, x := range data.GetShutOut() {
				out = x
			}
		}
		return out
	}
	for i, name := range names {
		flood(name)
		natstest.CheckFor(t, 10*time.Second, func() error {
			if x := shutOut(); x.GetAsker() != name || x.GetTimes() != uint64(i+1) || x.GetUntil() == "" {
				return fmt.Errorf("shut out %v, want partition 0 shut out for %s, time %d", x, name, i+1)
			}
			return nil
		})
		natstest.CheckFor(t, 10*time.Second, func() error { // its pause over: open again
			if x := shutOut(); x.GetUntil() != "" {
				return errors.New("partition 0 still shut out")
			}
			return nil
		})
	}
	if requests == 0 {
		t.Error("compose-node counted no request")
	}
}

// When serve's partitions and nats-server's mappings disagree, a node's
// request is answered a 503 that says which to fix, in both directions,
// rather than "no responders" or nothing.
func TestPartitionsAndMappingsThatDisagreeAreNamed(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name            string
		mapped, serveIn int
		want            string
	}{
		{"mapped, serve unpartitioned", 4, 0, "serve --partitions N"},
		{"serve partitioned, not mapped", 0, 4, "permissions --mappings --partitions 4"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nc := natstest.Connect(t, natstest.StartWithConfig(t, permissions.MappingsConfig(tc.mapped)))
			servicetest.Start(t, nc, func(c *service.Config) { c.Partitions = tc.serveIn })
			body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: "ace"})
			inbox := wire.InboxPrefix(wire.RoleNode, "ace") + ".x"
			sub, err := nc.SubscribeSync(inbox)
			if err != nil {
				t.Fatal(err)
			}
			if err := nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, "ace"), inbox, body); err != nil {
				t.Fatal(err)
			}
			answer, err := sub.NextMsg(5 * time.Second)
			if err != nil {
				t.Fatal(err)
			}
			if code, sentence := answer.Header.Get(wire.ErrorCodeHeader), answer.Header.Get(wire.ErrorHeader); code != "503" || !strings.Contains(sentence, tc.want) {
				t.Errorf("answered %s %q, want a 503 naming %s", code, sentence, tc.want)
			}
		})
	}
}

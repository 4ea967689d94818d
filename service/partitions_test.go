package service_test

import (
	"errors"
	"fmt"
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

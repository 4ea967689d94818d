package service_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// A request that waited in the queue longer than MaxQueueWait is answered
// 503 without being computed, and counted as shed. With a wait of 1ns,
// every request has.
func TestRequestsWaitingTooLongAreShed(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc, func(cfg *service.Config) { cfg.MaxQueueWait = time.Nanosecond })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err := client.New(nc).Provisioning(ctx, &provisionerv1.ProvisioningRequest{})
	var werr *wire.Error
	if !errors.As(err, &werr) || werr.Code() != wire.CodeUnavailable || !strings.Contains(werr.Sentence(), "in its queue") {
		t.Fatalf("got %v, want a 503 for a request that waited in the queue", err)
	}
	msg, err := nc.Request("$SRV.STATS."+wire.ServiceName, nil, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Endpoints []struct {
			Name string `json:"name"`
			Data struct {
				Shed      uint64 `json:"shed"`
				Answered  uint64 `json:"answered"`
				QueueFull uint64 `json:"queue_full"`
			} `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatal(err)
	}
	for _, ep := range stats.Endpoints {
		if ep.Name == "provisioning" && (ep.Data.Shed != 1 || ep.Data.Answered != 0) {
			t.Errorf("provisioning stats %+v, want 1 shed and none answered", ep.Data)
		}
	}
}

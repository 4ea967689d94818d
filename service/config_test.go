package service_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
)

// A negative value means "no limit" in the fields that say so, and is
// refused in every other field: no field reads a negative value as its
// default or as "none".
func TestConfigRefusesNegativesWithoutNoLimit(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	for name, set := range map[string]func(*service.Config){
		"Concurrency":         func(c *service.Config) { c.Concurrency = -1 },
		"MaxQueueWait":        func(c *service.Config) { c.MaxQueueWait = -time.Second },
		"RevisionWait":        func(c *service.Config) { c.RevisionWait = -time.Second },
		"SlowCompose":         func(c *service.Config) { c.SlowCompose = -time.Second },
		"MaxWaiting":          func(c *service.Config) { c.MaxWaiting = -1 },
		"AnswerCacheMaxBytes": func(c *service.Config) { c.AnswerCacheMaxBytes = -1 },
		"PageMaxBytes":        func(c *service.Config) { c.PageMaxBytes = -1 },
	} {
		cfg := service.Config{Conn: nc}
		set(&cfg)
		svc, err := service.Start(t.Context(), cfg)
		if err == nil {
			svc.Stop()
			t.Errorf("%s negative: started, want refused", name)
			continue
		}
		if !strings.Contains(err.Error(), "Config."+name) {
			t.Errorf("%s negative: %v, want an error naming the field", name, err)
		}
	}
}

// NodeMaxBytes: zero holds DefaultNodeMaxBytes of a node, NoLimit holds
// all of it.
func TestNodeMaxBytesNoLimit(t *testing.T) {
	t.Parallel()
	const size = 60 << 10 // under the buckets' largest value
	values := service.DefaultNodeMaxBytes/size + 2
	for _, tc := range []struct {
		name     string
		maxBytes int
		wantOver bool
	}{
		{"default", 0, true},
		{"no limit", service.NoLimit, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			nc := natstest.Connect(t, natstest.Start(t))
			svc := servicetest.Start(t, nc, func(c *service.Config) { c.NodeMaxBytes = tc.maxBytes })
			needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
			value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:" + strings.Repeat("x", size) + "}"})
			if err != nil {
				t.Fatal(err)
			}
			var last uint64
			for i := range values {
				last = put(t, needs, fmt.Sprintf("ace.web.port.p%03d", i), value)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			got := askNeeds(ctx, t, client.New(nc), "ace", last)
			var over []map[string]any
			if err := json.Unmarshal(endpointData(t, svc)["over_budget"], &over); err != nil {
				t.Fatal(err)
			}
			if tc.wantOver {
				if len(over) != 1 || len(got.GetNeeds()) >= values {
					t.Errorf("%d needs held, over budget %v: want fewer than %d held and ace over its budget", len(got.GetNeeds()), over, values)
				}
				return
			}
			if len(over) != 0 || len(got.GetNeeds()) != values || len(got.GetMalformed()) != 0 {
				t.Errorf("%d needs held, %d malformed, over budget %v: want all %d held, none over", len(got.GetNeeds()), len(got.GetMalformed()), over, values)
			}
		})
	}
}

// NoAnswerCache keeps no answer: a repeated request is computed again.
func TestNoAnswerCache(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	svc := servicetest.Start(t, nc, func(c *service.Config) { c.NoAnswerCache = true })
	c := client.New(nc)
	req := &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"}
	for range 3 {
		if _, err := c.ProvisioningAll(t.Context(), req); err != nil {
			t.Fatal(err)
		}
	}
	var cache map[string]any
	if err := json.Unmarshal(endpointData(t, svc)["answer_cache"], &cache); err != nil {
		t.Fatal(err)
	}
	if hits, _ := cache["hits"].(float64); hits != 0 {
		t.Errorf("answer cache %v: want no hits", cache)
	}
}

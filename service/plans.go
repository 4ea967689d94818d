package service

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/service/plans"
)

// DefaultPlansInterval is how often the plans' writer looks at what the
// copy does not announce; a change it announces is looked at a few
// milliseconds after it (plans.Settle).
const DefaultPlansInterval = plans.DefaultInterval

// PlansConfig is what RunPlans needs.
type PlansConfig struct {
	// KV is the bucket mesh-provisioner_plans, bound by the identity that
	// writes it (permissions.ServerWriter). Required.
	KV jetstream.KeyValue
	// Interval is how often the writer looks at what the copy does not
	// announce; zero means DefaultPlansInterval.
	Interval time.Duration
	// Holds and HoldsChanged, if set, bound the nodes whose keys the
	// writer keeps to those Holds says yes to now (plans.Config.Holds):
	// of the partitions whose seats this instance holds.
	Holds        func(node string) bool
	HoldsChanged <-chan struct{}
}

// RunPlans keeps mesh-provisioner_plans from this service's copy until ctx
// is done, as plans.Run says; the endpoints' stats count what it did. The
// seat's holder runs it in its tenure.
func (s *Service) RunPlans(ctx context.Context, cfg PlansConfig) error {
	return plans.Run(ctx, plans.Config{
		KV: cfg.KV, JS: s.store.js, Interval: cfg.Interval, Copy: s.mirror, Holds: cfg.Holds, HoldsChanged: cfg.HoldsChanged, Ready: s.WaitReady,
		Stats: &s.plans, Logger: s.logger, Warnings: s.warnings,
	})
}

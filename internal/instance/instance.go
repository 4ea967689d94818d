package instance

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"golang.org/x/sync/errgroup"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/seat"
	"github.com/novox/mesh-provisioner/service"
)

// ErrJetStreamNotEnabled is returned by Start when the NATS joined has no
// JetStream for the writing identity's account, so there are no buckets to
// keep.
var ErrJetStreamNotEnabled = errors.New("JetStream is not enabled on this NATS")

// Config holds what an instance needs. Zero means the default in every
// field.
type Config struct {
	// Service configures the service. Its connections are required:
	// Service.Conn, the answering identity's (permissions.Server), and
	// Service.WatchConn, the writing identity's (permissions.ServerWriter),
	// through which the buckets are made, the seat is kept and everything
	// is written; they may be one connection where one identity holds both
	// grants (a test). Service.Seat nil reports the instance's own seat in
	// the endpoints' stats; a test may report another.
	Service service.Config
	// Buckets configures the buckets ensured at start. Their Partitions
	// are the service's: state buckets made for a partitioned mesh store
	// their keys by partition.
	Buckets buckets.Config
	// RegistryInterval is how often the seat's holder reconciles the
	// registry; zero means registry.DefaultInterval.
	RegistryInterval time.Duration
	// RestoreDelay is how long a registry entry changed by anyone else
	// stands before the holder restores it; zero means
	// registry.DefaultRestoreDelay.
	RestoreDelay time.Duration
	// PlansInterval is how often the holder looks for changed plans; zero
	// means service.DefaultPlansInterval.
	PlansInterval time.Duration
	// ReadyTimeout bounds how long Run waits for the copy to be whole and to
	// hold the registry; zero means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// SharePartitions, with Service.Partitions and no Service.Hold, has
	// the instance share the partitions with the other instances that do
	// (serve --hold auto): they are dealt among them, and move as
	// instances come and go (share.go).
	SharePartitions bool
	// ShareCopies, with SharePartitions, is how many instances serve each
	// partition (serve --hold-copies): with 2, a partition whose instance
	// dies is still answered by another, whose seat's lease then runs out
	// and is taken, at twice each instance's memory. Zero means 1.
	ShareCopies int
	// ShareExpect, with SharePartitions, is how many instances are
	// expected to share the partitions (serve --hold-expect): one that
	// starts deals itself its first share as soon as it has heard that
	// many members, itself among them, rather than after the rounds of
	// discovery that let instances started together hear each other
	// (firstShare). Zero waits the rounds.
	ShareExpect int
}

// DefaultReadyTimeout is Config.ReadyTimeout's default.
const DefaultReadyTimeout = time.Minute

// Instance is one mesh-provisioner instance: its service, its seat and the
// buckets the seat's holder writes.
type Instance struct {
	cfg      Config
	logger   *slog.Logger
	svc      *service.Service
	seat     *seat.Seat
	registry jetstream.KeyValue
	plans    jetstream.KeyValue
	serving  chan struct{}
	// servingOnce closes serving: Contend may run again after it returned.
	servingOnce sync.Once
	// contending is set while Contend runs: one seat, one tenure at once.
	contending atomic.Bool
	// partitionSeats are, by partition, the seats of those the service
	// may serve (service.Config.Hold; every one when it shares them), nil
	// for the others; seatHeld says which this instance holds, and
	// seatsChanged is told when one is taken or lost (partitions.go).
	partitionSeats []*seat.Seat
	seatHeld       []atomic.Bool
	seatsChanged   chan struct{}
	// heldMoved is closed, and replaced, when the partitions the service
	// serves change; announced tells the others sharing the partitions
	// that this instance is among them, until it leaves (share.go).
	heldMoved atomic.Pointer[chan struct{}]
	announced atomic.Pointer[micro.Service]
	// firstServes says, by partition, whether another instance, the
	// partition's first member, serves it: this one then leaves its seat
	// to that one (seatWanted). Nil: contend for every seat served.
	firstServes atomic.Pointer[[]bool]
	// roster keeps the members sharing the partitions (firstShare makes
	// it; the share loop, then handOver, update it, one after the other).
	roster *roster
}

// ErrContending is returned by Contend and Run while the instance already
// contends for the seat.
var ErrContending = errors.New("instance: Contend or Run is already running")

// Start checks that JetStream is there, ensures the buckets, binds the seat
// and starts the service, each step tried again while what the bus causes
// makes it fail (an election, a stream not yet placed), until ctx ends. The
// instance answers once Start returns, if only with a 503 while its copy
// loads; Contend (or Run) makes it contend for the seat.
func Start(ctx context.Context, cfg Config) (*Instance, error) {
	if cfg.Service.WatchConn == nil {
		return nil, errors.New("instance: Config.Service.WatchConn is required")
	}
	if cfg.ShareCopies < 0 || (cfg.ShareCopies > 1 && !cfg.SharePartitions) {
		return nil, errors.New("instance: Config.ShareCopies is negative, or above 1 without SharePartitions")
	}
	if cfg.ShareExpect < 0 || (cfg.ShareExpect > 0 && !cfg.SharePartitions) {
		return nil, errors.New("instance: Config.ShareExpect is negative, or above 0 without SharePartitions")
	}
	if cfg.SharePartitions {
		if cfg.Service.Partitions < 2 || len(cfg.Service.Hold) > 0 {
			return nil, errors.New("instance: Config.SharePartitions needs Service.Partitions (the mappings' count) and no Service.Hold: the partitions held are dealt")
		}
		cfg.Service.HoldChanges = true
	}
	if err := cfg.Service.Validate(); err != nil {
		return nil, err
	}
	if cfg.Service.Logger == nil {
		cfg.Service.Logger = slog.Default()
	}
	cfg.RegistryInterval = cmp.Or(cfg.RegistryInterval, registry.DefaultInterval)
	cfg.RestoreDelay = cmp.Or(cfg.RestoreDelay, registry.DefaultRestoreDelay)
	cfg.PlansInterval = cmp.Or(cfg.PlansInterval, service.DefaultPlansInterval)
	cfg.ReadyTimeout = cmp.Or(cfg.ReadyTimeout, DefaultReadyTimeout)
	in := &Instance{cfg: cfg, logger: cfg.Service.Logger, serving: make(chan struct{})}
	moved := make(chan struct{})
	in.heldMoved.Store(&moved)
	js, err := jetstream.New(cfg.Service.WatchConn)
	if err != nil {
		return nil, err
	}
	if err := jetStreamEnabled(ctx, js, cfg.Service.WatchConn.ConnectedUrlRedacted()); err != nil {
		return nil, err
	}
	if err := in.prepareBuckets(ctx, js); err != nil {
		return nil, err
	}
	svcCfg := cfg.Service
	if cfg.SharePartitions {
		svcCfg.Member = in.seat.ID()
		svcCfg.FirstHold = in.firstShare // once the service has bound the buckets
	}
	if svcCfg.PartitionSeats == nil && in.partitionSeats != nil {
		svcCfg.PartitionSeats = in.PartitionSeats
	}
	if svcCfg.Seat == nil {
		svcCfg.Seat = func() (bool, time.Time, string) {
			st := in.seat.Status()
			return st.Held, st.Since, st.Holder
		}
	}
	err = retryStart(ctx, in.logger, "start the service", func(sctx context.Context) (err error) {
		in.svc, err = service.Start(sctx, svcCfg)
		return err
	})
	if err != nil {
		in.leave()
		return nil, err
	}
	return in, nil
}

// jetStreamEnabled says so, in one sentence, when the NATS joined has no
// JetStream: otherwise the first bucket call fails with "no responders".
func jetStreamEnabled(ctx context.Context, js jetstream.JetStream, url string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err := js.AccountInfo(ctx)
	switch {
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled):
		return fmt.Errorf("%w at %s; enable it in the server's configuration (jetstream {...}) or join one that has it", ErrJetStreamNotEnabled, url)
	case errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount):
		return fmt.Errorf("%w for this identity's account at %s; enable JetStream for the account (jetstream: enabled) or use another", ErrJetStreamNotEnabled, url)
	}
	return nil // any other failure shows, with its own words, where the buckets are made
}

// prepareBuckets makes the buckets, opens the registry's and the plans',
// and binds the seat.
func (in *Instance) prepareBuckets(ctx context.Context, js jetstream.JetStream) error {
	made := in.cfg.Buckets
	made.Partitions = in.cfg.Service.Partitions
	if err := retryStart(ctx, in.logger, "make the buckets", func(ctx context.Context) error { return buckets.Ensure(ctx, js, made) }); err != nil {
		return err
	}
	for _, open := range []struct {
		bucket string
		kv     *jetstream.KeyValue
	}{{keys.RegistryBucket, &in.registry}, {keys.PlansBucket, &in.plans}} {
		err := retryStart(ctx, in.logger, "open the bucket "+open.bucket, func(ctx context.Context) (err error) {
			*open.kv, err = js.KeyValue(ctx, open.bucket)
			return err
		})
		if err != nil {
			return err
		}
	}
	// Of all instances on the mesh, the one that holds the seat writes the
	// registry and the plans, each write fenced by its lease; the others
	// stand by.
	err := retryStart(ctx, in.logger, "bind the provisioner seat", func(sctx context.Context) (err error) {
		in.seat, err = seat.New(sctx, seat.Config{JS: js, Logger: in.logger})
		return err
	})
	if err != nil {
		return err
	}
	return in.bindPartitionSeats(ctx, js)
}

// Service returns the instance's service.
func (in *Instance) Service() *service.Service { return in.svc }

// Seat returns the instance's seat.
func (in *Instance) Seat() *seat.Seat { return in.seat }

// Serving is closed once Contend (or Run) has found the copy whole and
// holding the registry: the instance answers right.
func (in *Instance) Serving() <-chan struct{} { return in.serving }

// Stop stops the service. Run stops it too; Stop is for an instance that
// was started and never run.
func (in *Instance) Stop() {
	in.leave()
	in.svc.Stop()
}

// Run is Contend, then the service stopped: it returns once ctx ends (nil)
// or Contend fails, with the seat handed back and the service stopped; the
// caller drains the connections then. An instance that shares the
// partitions first hands them over (within ReadyTimeout). An instance runs
// once.
func (in *Instance) Run(ctx context.Context) error {
	defer in.Stop()
	err := in.Contend(ctx)
	if in.cfg.SharePartitions && ctx.Err() != nil {
		// Serve on until the others serve what this one did: they read
		// it first, as it would. Its seats are handed back already, and
		// each is taken by the instance that serves its partition next.
		in.handOver(context.WithoutCancel(ctx), in.cfg.ReadyTimeout)
	}
	return err
}

// Contend contends for the seat until ctx ends and, while this instance
// holds it, reconciles the registry and writes the plan digests; meanwhile
// it waits for the copy to be whole and to hold the registry, then closes
// Serving. It returns once ctx ends (nil) or either side fails, with the
// seat handed back; the service answers on as a standby until Stop. It may
// run again after it returned, not twice at once (ErrContending).
func (in *Instance) Contend(ctx context.Context) error {
	if !in.contending.CompareAndSwap(false, true) {
		return ErrContending
	}
	defer in.contending.Store(false)
	reconciled := make(chan uint64, 1) // the revision of the first run that wrote the registry whole
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return in.contend(gctx, reconciled) })
	if in.partitionSeats != nil {
		g.Go(func() error { return in.writeHeldPlans(gctx) })
	}
	if in.cfg.SharePartitions {
		g.Go(func() error { return in.share(gctx) })
	}
	g.Go(func() error {
		readyCtx, cancel := context.WithTimeout(gctx, in.cfg.ReadyTimeout)
		defer cancel()
		if err := in.svc.WaitReady(readyCtx); err != nil {
			if gctx.Err() != nil {
				return nil
			}
			return err
		}
		// Serving means answering right: compositions need the registry
		// whole, as this instance wrote it if it took the seat, or as the
		// holder wrote it before.
		if err := in.waitForRegistry(readyCtx, reconciled); err != nil {
			if gctx.Err() != nil {
				return nil
			}
			return err
		}
		in.servingOnce.Do(func() { close(in.serving) })
		return nil
	})
	return g.Wait()
}

// contend runs the seat's tenure while this instance holds it, until ctx
// ends, telling reconciled the revision of the first reconciliation that
// wrote the registry whole.
func (in *Instance) contend(ctx context.Context, reconciled chan<- uint64) error {
	reconciler := &registry.Reconciler{KV: in.registry, Interval: in.cfg.RegistryInterval, RestoreDelay: in.cfg.RestoreDelay,
		Publisher: in.seat, Logger: in.logger,
		Reconciled: func(r registry.Report) {
			select {
			case reconciled <- r.Revision:
			default:
			}
		}}
	// The holder's tenure: the registry, and each node's plan digest but
	// where each partition's seat says who writes its nodes' plans
	// (writeHeldPlans).
	tenure := func(ctx context.Context) error {
		tg, tctx := errgroup.WithContext(ctx)
		tg.Go(func() error { return reconciler.Run(tctx) })
		if in.partitionSeats == nil {
			tg.Go(func() error {
				return in.svc.RunPlans(tctx, service.PlansConfig{KV: in.plans, Interval: in.cfg.PlansInterval})
			})
		}
		return tg.Wait()
	}
	if err := in.seat.Run(ctx, tenure); err != nil && ctx.Err() == nil { // not a write cut short by shutdown
		return fmt.Errorf("reconcile registry: %w", err)
	}
	return nil
}

// waitForRegistry returns once the service's copy holds the whole registry:
// up to the first reconciliation's revision if this instance holds the seat,
// or, for a standby, the registry the holder wrote.
func (in *Instance) waitForRegistry(ctx context.Context, reconciled <-chan uint64) error {
	poll := time.NewTicker(50 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case revision := <-reconciled:
			return in.svc.WaitRegistry(ctx, revision)
		case <-poll.C:
			if held, _ := in.seat.Held(); !held && in.svc.HasRegistry() {
				return nil
			}
		case <-ctx.Done():
			return fmt.Errorf("the registry is not in the copy yet: %w", ctx.Err())
		}
	}
}

// Run starts an instance and runs it until ctx ends: Start, then
// Instance.Run.
func Run(ctx context.Context, cfg Config) error {
	in, err := Start(ctx, cfg)
	if err != nil {
		return err
	}
	return in.Run(ctx)
}

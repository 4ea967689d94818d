package instance

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"

	"github.com/novox/mesh-provisioner/seat"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// In a mesh whose instances serve some partitions each (service.Config.Hold),
// each partition has a seat of its own (wire.PartitionSeatSubject), kept as
// the provisioner seat is, in the registry's stream: of the instances that
// serve a partition, the one that holds its seat writes its nodes' plans.
// The provisioner seat's holder reconciles the registry, and writes no plan.

// partitionSeatTTL is the life of a partition seat's lease without
// renewal: a holder that dies has its partitions' plans written again by a
// standby about this long after (issue 38 asks 5 s). Half the provisioner
// seat's, which fences the registry's writes: a partition's seat fences
// nothing (the plans' writes are compare-and-set), and losing it to an
// election longer than its lease only pauses its plans until the seat is
// taken again.
const partitionSeatTTL = 3 * time.Second

// bindPartitionSeats binds a seat for each partition the service may
// serve, under the provisioner seat's id: those it holds, or every one when
// it shares them.
func (in *Instance) bindPartitionSeats(ctx context.Context, js jetstream.JetStream) error {
	hold := in.cfg.Service.Hold
	if in.cfg.SharePartitions {
		hold = make([]int, in.cfg.Service.Partitions)
		for p := range hold {
			hold[p] = p
		}
	}
	if len(hold) == 0 {
		return nil
	}
	in.seatHeld = make([]atomic.Bool, in.cfg.Service.Partitions)
	in.seatsChanged = make(chan struct{}, 1)
	in.partitionSeats = make([]*seat.Seat, in.cfg.Service.Partitions)
	for _, p := range hold {
		err := retryStart(ctx, in.logger, fmt.Sprintf("bind the seat of partition %d", p), func(sctx context.Context) (err error) {
			in.partitionSeats[p], err = seat.New(sctx, seat.Config{JS: js, Subject: wire.PartitionSeatSubject(p), ID: in.seat.ID(), TTL: partitionSeatTTL,
				Logger: in.logger.With("partition", p), Name: fmt.Sprintf("seat of partition %d", p)})
			return err
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// writeHeldPlans contends for the seat of each partition the service
// serves, while it serves it, and writes the plans of the nodes of those
// it holds, until ctx ends.
func (in *Instance) writeHeldPlans(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return in.svc.RunPlans(gctx, service.PlansConfig{KV: in.plans, Interval: in.cfg.PlansInterval,
			Holds: in.holdsSeatOf, HoldsChanged: in.seatsChanged})
	})
	for p, st := range in.partitionSeats {
		if st != nil {
			g.Go(func() error { return in.keepSeat(gctx, p, st) })
		}
	}
	return g.Wait()
}

// keepSeat contends for the seat of partition p while the instance wants
// it (seatWanted), and hands it back when it no longer does, until ctx
// ends.
func (in *Instance) keepSeat(ctx context.Context, p int, st *seat.Seat) error {
	tenure := func(tenure context.Context) error {
		in.seatHeld[p].Store(true)
		in.tellSeats()
		<-tenure.Done()
		in.seatHeld[p].Store(false)
		in.tellSeats()
		return nil
	}
	for {
		if !in.waitHeld(ctx, p, true) {
			return nil
		}
		serving, letGo := context.WithCancel(ctx)
		go func() {
			defer letGo()
			in.waitHeld(serving, p, false)
		}()
		err := st.Run(serving, tenure)
		letGo()
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			return fmt.Errorf("the seat of partition %d: %w", p, err)
		}
	}
}

// waitHeld waits until whether the instance contends for p's seat
// (seatWanted) is held, and reports so; false when ctx ended first.
func (in *Instance) waitHeld(ctx context.Context, p int, held bool) bool {
	for {
		moved := in.heldMoved.Load()
		if in.seatWanted(p) == held {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-*moved:
		}
	}
}

// seatWanted reports whether the instance contends for p's seat: it serves
// p and, when it shares the partitions, it is p's first member or p's first
// member does not serve p (firstServes), so that the plans' writing is
// spread with the partitions' first copies.
func (in *Instance) seatWanted(p int) bool {
	if !in.svc.HoldsPartition(p) {
		return false
	}
	first := in.firstServes.Load()
	return first == nil || !(*first)[p]
}

// tellHeldMoved wakes those waiting for the partitions served to change.
func (in *Instance) tellHeldMoved() {
	moved := make(chan struct{})
	close(*in.heldMoved.Swap(&moved))
}

// holdsSeatOf reports whether this instance holds the seat of node's
// partition: the plans writer keeps node's key.
func (in *Instance) holdsSeatOf(node string) bool {
	return in.seatHeld[wire.PartitionOf(node, len(in.seatHeld))].Load()
}

// tellSeats tells the plans writer that the seats held changed.
func (in *Instance) tellSeats() {
	select {
	case in.seatsChanged <- struct{}{}:
	default: // told already
	}
}

// PartitionSeats returns the partitions whose seats this instance holds,
// in order: it writes their nodes' plans.
func (in *Instance) PartitionSeats() []int {
	var held []int
	for p := range in.seatHeld {
		if in.seatHeld[p].Load() {
			held = append(held, p)
		}
	}
	return held
}

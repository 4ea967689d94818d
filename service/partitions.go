package service

import (
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/backoff"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/wire"
)

// A partition is one of Config.Partitions shares of the nodes and
// providers, which nats-server's subject mapping routes apart
// (wire.PartitionMappings). Its addressed endpoints are a micro instance of
// their own, so that the service can unsubscribe them alone: when one of
// its askers floods, nats-server then drops the partition's requests
// before it sends them, and the other partitions' askers are answered as
// if nothing happened. A door drops a flood for less than it costs to
// read, but reading it still takes the cores from every asker; only
// nats-server not sending it gives them back (make bench-fair).
type partition struct {
	index int
	token string // ".<index>", the last token of the partition's subjects
	// drops counts its requests dropped at the doors since the last weighing.
	drops atomic.Uint64

	// Guarded by Service.registering.
	micro micro.Service // nil while shut out, or before it first opens
	// relay is the micro instance of its relay endpoints (registerRelay),
	// open while the instance serves the partition, shut out or not: a
	// walk of every node crosses every partition.
	relay micro.Service
	until time.Time // when a shut-out ends; zero before the first
	times uint64    // shut-outs since the instance started
	asker string    // whom it was last shut out for
	pause *backoff.Backoff
	// openSince is when it last opened: open a minute, its next pause is
	// the first again.
	openSince time.Time
	// flooder is the asker whose drop crossed floodAt last.
	flooder atomic.Pointer[string]
	// shown is what the stats say of it: written under
	// Service.registering, read without it, since micro asks the stats
	// holding a lock that stopping an instance takes.
	shown atomic.Pointer[provisionerv1.PartitionShutOut]
}

// Shutting partitions out. The first shut-out lasts a second and each one
// after it twice the last, up to a minute, so that a flooder that keeps on
// is heard for a moment a minute; a partition open for a minute starts
// again at a second.
const (
	// weighEvery is how often each partition's drops are weighed.
	weighEvery     = 100 * time.Millisecond
	shutOutFirst   = time.Second
	shutOutLongest = time.Minute
)

// newPartitions returns n partitions, none for n below 2.
func newPartitions(n int) []*partition {
	if n < 2 {
		return nil
	}
	out := make([]*partition, n)
	for i := range out {
		out[i] = &partition{index: i, token: "." + strconv.Itoa(i),
			pause: backoff.New(backoff.Config{Min: shutOutFirst, Max: shutOutLongest, Factor: 2})}
	}
	return out
}

// partitioned is a request as its asker sent it: the subject without the
// partition nats-server appended, which every verb reads its asker from.
type partitioned struct {
	micro.Request
	subject string
}

func (r partitioned) Subject() string { return r.subject }

// unpartitioned returns r with its subject as its asker sent it.
func (pt *partition) unpartitioned(r micro.Request) micro.Request {
	return partitioned{Request: r, subject: strings.TrimSuffix(r.Subject(), pt.token)}
}

// openPartitions opens every partition the instance serves: its relay
// endpoints, and, unless it is shut out, its micro instance and its
// addressed endpoints. Called with s.registering held.
func (s *Service) openPartitions() error {
	for _, pt := range s.partitions {
		if !s.HoldsPartition(pt.index) {
			continue
		}
		if pt.relay == nil && s.held.Load() != nil {
			if err := s.openRelay(pt); err != nil {
				return err
			}
		}
		if pt.micro == nil && pt.until.IsZero() {
			if err := s.openPartition(pt, time.Now()); err != nil {
				return err
			}
		}
	}
	return nil
}

// partitionMetadata is what a partition's micro instances tell of
// themselves: which partition, of how many, of which instance (and which
// member, if it shares the partitions).
func (s *Service) partitionMetadata(pt *partition) map[string]string {
	metadata := map[string]string{"partition": strconv.Itoa(pt.index), wire.PartitionsMetadata: strconv.Itoa(len(s.partitions)),
		wire.PartitionOfInstance: s.micro.Info().ID}
	if s.member != "" {
		metadata[wire.MemberMetadata] = s.member
	}
	return metadata
}

// openRelay adds pt's relay endpoints, a micro instance of their own.
// Called with s.registering held.
func (s *Service) openRelay(pt *partition) error {
	cfg := s.microConfig(s.version)
	cfg.DoneHandler = nil // stopped when the partition is let go
	cfg.Metadata = s.partitionMetadata(pt)
	svc, err := micro.AddService(s.conn, cfg)
	if err != nil {
		return err
	}
	for _, ep := range s.endpoints() {
		if err := ep.registerRelay(s, svc, pt.index); err != nil {
			_ = svc.Stop()
			return err
		}
	}
	pt.relay = svc
	return nil
}

// closePartition stops pt's micro instances, its relay endpoints' too,
// keeping their counts. Called with s.registering held.
func (s *Service) closePartition(pt *partition) {
	for _, svc := range []*micro.Service{&pt.micro, &pt.relay} {
		if *svc == nil {
			continue
		}
		counted := (*svc).Stats() // before Stop, which forgets them
		if err := (*svc).Stop(); err != nil {
			s.logger.Warn("stopping a partition's endpoints", "partition", pt.index, "err", err)
		}
		s.retire(counted)
		*svc = nil
	}
}

// openPartition adds pt's micro instance and endpoints. Called with
// s.registering held.
func (s *Service) openPartition(pt *partition, now time.Time) error {
	cfg := s.microConfig(s.version)
	cfg.DoneHandler = nil // a shut-out stops it: logged as such
	cfg.Metadata = s.partitionMetadata(pt)
	svc, err := micro.AddService(s.conn, cfg)
	if err != nil {
		return err
	}
	for _, ep := range s.endpoints() {
		if ep.namesAsker() {
			if err := ep.register(s, svc, pt); err != nil {
				_ = svc.Stop()
				return err
			}
		}
	}
	pt.micro, pt.openSince = svc, now
	if pt.times > 0 {
		pt.shown.Store(&provisionerv1.PartitionShutOut{Partition: uint32(pt.index), Asker: pt.asker, Times: pt.times})
	}
	return nil
}

// floodAt is how many requests of a partition, dropped at its doors
// between two weighings, shut it out: more than an asker may ask a read
// verb in that time (the write verbs' rate when reads have no bound, the
// default rate when neither has), and at least minFlood, so that a few
// requests past a small rate shut out no one.
func floodAt(rate, writeRate int) uint64 {
	switch {
	case rate > 0:
	case writeRate > 0:
		rate = writeRate
	default:
		rate = DefaultMaxRatePerAsker // the doors still drop what their lines have no room for
	}
	return uint64(max(float64(rate)*weighEvery.Seconds(), minFlood)) + 1
}

// minFlood is the fewest drops between two weighings that shut a partition
// out: 1,000 a second.
const minFlood = 100

// dropped counts a request of asker dropped at a door of pt, and has pt
// shut out once its drops since the last weighing reach floodAt: at once,
// so that a flood reaches the service for no more than the moment it takes
// to cross that count, and for the asker whose request crossed it.
func (s *Service) dropped(pt *partition, asker string) {
	if pt.drops.Add(1) == s.floodAt {
		flooder := strings.Clone(asker) // a window on the request's subject
		pt.flooder.Store(&flooder)
		select {
		case s.flooded <- pt:
		default: // already told
		}
	}
}

// weighPartitions shuts out each partition that floods (dropped), and
// every weighEvery opens again those whose pause is over and starts each
// partition's count of drops afresh, until the service stops.
func (s *Service) weighPartitions() {
	tick := time.NewTicker(weighEvery)
	defer tick.Stop()
	for {
		select {
		case <-s.stopping.Done():
			return
		case pt := <-s.flooded:
			s.registering.Lock()
			if !s.unregistered && pt.micro != nil {
				s.shutOut(pt, time.Now())
			}
			s.registering.Unlock()
		case now := <-tick.C:
			s.registering.Lock()
			for _, pt := range s.partitions {
				pt.drops.Store(0)
				if !s.unregistered && pt.micro == nil && !pt.until.IsZero() && now.After(pt.until) && s.HoldsPartition(pt.index) {
					if err := s.openPartition(pt, now); err != nil {
						pt.until = now.Add(shutOutFirst)
						s.logger.Error("opening a partition again failed; trying again in a second", "partition", pt.index, "err", err)
					}
				}
			}
			s.registering.Unlock()
		}
	}
}

// shutOut unsubscribes pt's endpoints for its next pause. Called with
// s.registering held.
func (s *Service) shutOut(pt *partition, now time.Time) {
	if now.Sub(pt.openSince) >= shutOutLongest {
		pt.pause.Reset()
	}
	counted := pt.micro.Stats() // before Stop, which forgets them
	if err := pt.micro.Stop(); err != nil {
		// Still subscribed, perhaps: shut out at the next flood's signal.
		s.logger.Warn("stopping a partition's endpoints to shut it out", "partition", pt.index, "err", err)
		return
	}
	s.retire(counted)
	pause := pt.pause.Next()
	pt.micro, pt.until = nil, now.Add(pause)
	if flooder := pt.flooder.Load(); flooder != nil {
		pt.asker = *flooder
	}
	pt.times++
	pt.shown.Store(&provisionerv1.PartitionShutOut{Partition: uint32(pt.index), Asker: pt.asker, Times: pt.times,
		Until: pt.until.UTC().Format(time.RFC3339)})
	s.warnings.Log(slog.LevelWarn, "partition shut out", pt.asker,
		"a node or provider asked its own subjects far faster than its rate (serve --max-rate-per-asker): its partition's subjects are unsubscribed for a while, so that nats-server drops their requests before sending them, and its partition's askers hear no responders meanwhile; every other partition is answered as before",
		"partition", pt.index, "for", pause.String())
}

// retire keeps the micro counts of a partition's instance stopped, by
// endpoint, for Stats. Called with s.registering held.
func (s *Service) retire(counted micro.Stats) {
	if s.retired == nil {
		s.retired = map[string]*micro.EndpointStats{}
	}
	for _, e := range counted.Endpoints {
		sum, ok := s.retired[e.Name]
		if !ok {
			sum = &micro.EndpointStats{Name: e.Name, Subject: e.Subject, QueueGroup: e.QueueGroup}
			s.retired[e.Name] = sum
		}
		sum.NumRequests += e.NumRequests
		sum.NumErrors += e.NumErrors
		sum.ProcessingTime += e.ProcessingTime
		if e.LastError != "" {
			sum.LastError = e.LastError
		}
	}
}

// closePartitions stops every open partition's endpoints. Called with
// s.registering held, as the service stops.
func (s *Service) closePartitions() {
	for _, pt := range s.partitions {
		s.closePartition(pt)
	}
}

// shutOutStats are the partitions shut out now or before, for the stats.
func (s *Service) shutOutStats() []*provisionerv1.PartitionShutOut {
	var out []*provisionerv1.PartitionShutOut
	for _, pt := range s.partitions {
		if x := pt.shown.Load(); x != nil {
			out = append(out, x)
		}
	}
	return out
}

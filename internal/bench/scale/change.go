package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/nats-io/nuid"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/bench/meshchange"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// restoreDelay is given every instance (--registry-restore-delay, at most
// 4 s): the change meshChange makes stands that long, then the seat's
// holder restores the entry.
const restoreDelay = 4 * time.Second

// change is a registry entry every node's composition reads (most of them:
// meshchange.WidestKind), and who reads it.
type change struct {
	kind    string
	readers map[string]bool
}

// wave is a change's digests: how long until the last reader's was heard,
// or, when the change was cut short, how many of the readers' were heard
// in the time it stood.
type wave struct {
	took           time.Duration
	heard, readers int
	// pass is, for a change cut short, the slowest writer's pass that
	// composed it (PlansStats.last_pass_ms): from the change it saw to its
	// digests written.
	pass time.Duration
}

func (w wave) whole() bool { return w.readers > 0 && w.heard == w.readers }

func (w wave) String() string {
	switch {
	case w.readers == 0:
		return "-" // not timed
	case !w.whole():
		return fmt.Sprintf(">%s (%d of %d; the writers' pass %s)", w.took, w.heard, w.readers, w.pass.Round(time.Millisecond))
	default:
		return w.took.Round(time.Millisecond).String()
	}
}

// meshChange times a change that every reader's composition sees: the
// entry changed, from its put to the last reader's new digest read from
// the plans bucket (as a node hears it on its plan's subject); then the
// entry restored by the seat's holder restoreDelay later, from the restore
// heard to the last reader's digest again. A change whose digests take
// longer than restoreDelay is cut short by the restore: its wave says how
// many were heard, and the restore is not timed. It first waits until
// instances processes' writers have written every plan and are idle, and
// again after.
func meshChange(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, c change, nodes, instances int) (changed, restored wave, err error) {
	if err := plansIdle(ctx, js, nc, nodes, instances); err != nil {
		return changed, restored, err
	}
	reg, err := js.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		return changed, restored, err
	}
	renamed, err := meshchange.ChangeKind(ctx, reg, c.kind)
	if err != nil {
		return changed, restored, err
	}
	entryWatch, err := reg.Watch(ctx, c.kind, jetstream.UpdatesOnly())
	if err != nil {
		return changed, restored, err
	}
	defer func() { _ = entryWatch.Stop() }()
	plans, err := js.Stream(ctx, wire.StreamOf(keys.PlansBucket))
	if err != nil {
		return changed, restored, err
	}
	info, err := plans.Info(ctx)
	if err != nil {
		return changed, restored, err
	}
	cons, err := plans.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: info.State.LastSeq + 1})
	if err != nil {
		return changed, restored, err
	}
	msgs, err := cons.Messages()
	if err != nil {
		return changed, restored, err
	}
	defer msgs.Stop()
	prefix := wire.KVPrefix(keys.PlansBucket)
	// hear gathers the readers' digests from began for at most within.
	hear := func(began time.Time, within time.Duration) wave {
		heard := map[string]bool{}
		deadline := began.Add(within)
		for len(heard) < len(c.readers) {
			msg, err := msgs.Next(jetstream.NextMaxWait(max(time.Until(deadline), time.Millisecond)))
			if err != nil {
				return wave{took: within, heard: len(heard), readers: len(c.readers)}
			}
			if node := strings.TrimPrefix(msg.Subject(), prefix); c.readers[node] {
				heard[node] = true
			}
		}
		return wave{took: time.Since(began), heard: len(heard), readers: len(c.readers)}
	}
	// updated returns when the entry's next change was heard.
	updated := func() (time.Time, error) {
		select {
		case <-entryWatch.Updates():
			return time.Now(), nil
		case <-time.After(time.Minute):
			return time.Time{}, fmt.Errorf("the registry entry %s was not changed within a minute", c.kind)
		}
	}
	passes, err := processStats(nc)
	if err != nil {
		return changed, restored, err
	}
	began := time.Now()
	if _, err := reg.Put(ctx, c.kind, renamed); err != nil {
		return changed, restored, err
	}
	if _, err := updated(); err != nil { // the change itself
		return changed, restored, err
	}
	changed = hear(began, restoreDelay)
	restoredAt, err := updated()
	if err != nil {
		return changed, restored, err
	}
	if !changed.whole() {
		if changed.pass, err = slowestPass(nc, passes); err != nil {
			return changed, restored, err
		}
	}
	if changed.whole() {
		if restored = hear(restoredAt, 10*time.Minute); !restored.whole() {
			return changed, restored, fmt.Errorf("the registry entry %s restored: %s readers' digests heard", c.kind, restored)
		}
	}
	return changed, restored, plansIdle(ctx, js, nc, nodes, instances)
}

// slowestPass returns the longest of the passes the processes' writers end
// next, once each has ended one: its last_pass_ms moves from what before
// says, and holds while the next pass runs.
func slowestPass(nc *nats.Conn, before map[string]*provisionerv1.EndpointStatsData) (time.Duration, error) {
	passes := map[string]time.Duration{}
	for deadline := time.Now().Add(10 * time.Minute); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		now, err := processStats(nc)
		if err != nil {
			return 0, err
		}
		for id, data := range now {
			if was, ok := before[id]; ok && data.GetPlans().GetLastPassMs() != was.GetPlans().GetLastPassMs() {
				if _, seen := passes[id]; !seen {
					passes[id] = time.Duration(data.GetPlans().GetLastPassMs()) * time.Millisecond
				}
			}
		}
		if len(passes) == len(before) {
			return slices.Max(slices.Collect(maps.Values(passes))), nil
		}
	}
	return 0, fmt.Errorf("%d of %d writers ended a pass within 10 minutes", len(passes), len(before))
}

// plansIdle waits until instances processes' writers have each made a
// pass, composed every node of theirs between them, and have nothing
// pending, and the plans bucket holds a plan of every node and has not
// moved for a second.
func plansIdle(ctx context.Context, js jetstream.JetStream, nc *nats.Conn, nodes, instances int) error {
	plans, err := js.Stream(ctx, wire.StreamOf(keys.PlansBucket))
	if err != nil {
		return err
	}
	deadline := time.Now().Add(10 * time.Minute)
	var last uint64
	quiet := time.Now()
	for time.Now().Before(deadline) {
		time.Sleep(100 * time.Millisecond)
		info, err := plans.Info(ctx)
		if err != nil {
			return err
		}
		if info.State.LastSeq != last {
			last, quiet = info.State.LastSeq, time.Now()
			continue
		}
		all, err := processStats(nc)
		if err != nil {
			return err
		}
		composed, pending := uint64(0), uint64(0)
		for _, data := range all {
			composed += data.GetPlans().GetComposed()
			pending += data.GetPlans().GetPending()
		}
		if len(all) >= instances && composed >= uint64(nodes) && pending == 0 &&
			info.State.NumSubjects >= uint64(nodes) && time.Since(quiet) >= time.Second {
			return nil
		}
	}
	return errors.New("the plans writers did not settle within 10 minutes")
}

// processStats returns each serving process's own stats data, by its micro
// instance's id, from that instance (a partition's names its process in its
// metadata), the answers heard within a second of the last.
func processStats(nc *nats.Conn) (map[string]*provisionerv1.EndpointStatsData, error) {
	inbox := nats.NewInbox() + "." + nuid.Next()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest("$SRV.STATS."+wire.ServiceName, inbox, nil); err != nil {
		return nil, err
	}
	all := map[string]*provisionerv1.EndpointStatsData{}
	for {
		msg, err := sub.NextMsg(time.Second)
		if err != nil {
			return all, nil //nolint:nilerr // every answer in
		}
		var stats micro.Stats
		if json.Unmarshal(msg.Data, &stats) != nil || len(stats.Endpoints) == 0 || stats.Metadata[wire.PartitionOfInstance] != "" {
			continue
		}
		if data, err := wire.DecodeStatsData(stats.Endpoints[0].Data); err == nil {
			all[stats.ID] = data
		}
	}
}

// ratioOf says how long wave a took against b, when both are whole.
func ratioOf(a, b wave) string {
	if !a.whole() || !b.whole() {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(a.took)/float64(b.took))
}

package plans

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"runtime"
	"runtime/debug"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/backoff"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/observe/ratelog"
	"github.com/novox/mesh-provisioner/wire"
)

// DefaultInterval is how often the plans' writer looks at what the copy
// does not announce (a node to compose again or gone, and the
// providers' buckets): a change the copy announces is looked at within
// Settle.
const DefaultInterval = 20 * time.Millisecond

// Settle is how long the writer, told that the copy moved, waits for what
// moves with it (a module's apply, a reconcile's entries) before it looks:
// a burst is composed once, and a change heard a few milliseconds after
// it rather than at the next interval. A pass still running gathers what
// comes meanwhile into the next, looked at once it ends. Two looks are
// Settle apart at least.
const Settle = 2 * time.Millisecond

// Share bounds what one node's compositions cost the seat's holder:
// after composing a node of n records, the writer composes it again no
// sooner than (Share-1)·n times the cost of a record, so that a node
// rewriting its records without pause has about 1/Share of a core
// spent on its digest, however fast it writes. A change meanwhile is put
// off, not lost: the node is composed once its time comes. Nodes whose
// pause is within Settle (some 700 records) are never put off, and only
// those whose pause is longer than the interval (thousands of records at
// the default) are logged.
//
// A record's cost is the least a record has taken to compose in the
// tenure (planCostSample), not each node's own time: a composition's time
// on a loaded instance (a pass beside a thousand requests, a collection)
// is many times its cost, and would put off nodes that only changed twice;
// and the least time follows the machine, where a constant would not (a
// build with the race detector composes ten times slower).
const Share = 10

// planCostSample is the fewest records a composition is timed for a
// record's cost: fewer take too little time to time.
const planCostSample = 64

// planRecordCost is a record's cost until a composition is timed for it:
// about this machine's (a 10,304-record node digested in 3.2 ms).
const planRecordCost = 300 * time.Nanosecond

// Config is what Run needs.
type Config struct {
	// KV is the bucket mesh-provisioner_plans, bound by the identity that
	// writes it (permissions.ServerWriter). Required.
	KV jetstream.KeyValue
	// JS is that identity's JetStream, which publishes a pass's digests
	// many at once. Required.
	JS jetstream.JetStream
	// Interval is how often the writer looks at what the copy does not
	// announce (DefaultInterval); zero means DefaultInterval.
	Interval time.Duration
	// Copy is the watched copy the nodes are composed from. Required.
	Copy *mirror.Mirror
	// Holds, if set, says which nodes' keys Run keeps now: those of the
	// partitions whose seats this instance holds, among those whose
	// records its copy holds (mirror.Mirror.SetHolds). The others' keys
	// are other writers', and left as they are. Nil keeps every node's.
	Holds func(node string) bool
	// HoldsChanged, with Holds, is told when what Holds says changed: Run
	// then brings every node it keeps up to date, as when it starts.
	HoldsChanged <-chan struct{}
	// Ready returns once the copy is whole, or ctx's error: Run writes
	// nothing before. Required.
	Ready func(ctx context.Context) error
	// Stats receives Run's counts. Required.
	Stats *Stats
	// Logger receives what fails; Warnings what a node can cause, at most
	// once a minute per cause and node. Required.
	Logger   *slog.Logger
	Warnings *ratelog.Limiter
}

// Stats are Run's counts, for the endpoints' stats.
type Stats struct {
	Written, Composed, Failed, Pending, LastPassMS, Deferred atomic.Uint64
	LastWritten                                              atomic.Int64 // unix nanoseconds; zero: none
}

// Proto returns the counts as the stats message carries them.
func (p *Stats) Proto() *provisionerv1.PlansStats {
	out := &provisionerv1.PlansStats{
		Written: p.Written.Load(), Composed: p.Composed.Load(), Failed: p.Failed.Load(),
		Pending: p.Pending.Load(), LastPassMs: p.LastPassMS.Load(), Deferred: p.Deferred.Load(),
	}
	if at := p.LastWritten.Load(); at != 0 {
		out.LastWritten = time.Unix(0, at).UTC().Format(time.RFC3339Nano)
	}
	return out
}

// heldDigest is a node's key in the plans bucket as last seen.
type heldDigest struct {
	digest   string
	revision uint64
}

// plansWriter keeps one tenure's view of the plans bucket.
type plansWriter struct {
	copy     *mirror.Mirror
	holds    func(node string) bool
	stats    *Stats
	warnings *ratelog.Limiter
	kv       jetstream.KeyValue
	js       jetstream.JetStream
	interval time.Duration
	mu       sync.Mutex
	key      map[string]heldDigest // what the bucket holds, by node
	// redo are nodes whose key changed under the writer (deleted, or
	// written by another): composed again on the next pass.
	redo map[string]bool
	// swept is when the writer last looked for keys of nodes gone.
	swept time.Time
	// buckets are the providers' buckets each node's last composition
	// named, named to the copy again on every sweep: a bucket not made yet
	// is followed for as long as a node's needs name it, not forgotten
	// while no request composes the node (mirror.Bound's forgetting).
	buckets map[string][]string
	// writing holds the digest of each node's write in flight (write).
	writing map[string]string
	// lastRead are the registry entries and providers' manifests each
	// node's last composition read: a change of one composes its readers
	// only.
	lastRead map[string]nodeReads
	// registry and manifests are the revisions of each registry entry
	// (by kind) and each provider's newest manifest (by provider) as the
	// writer last looked, to tell which changed.
	registry, manifests map[string]uint64
	// kept is what composes each node's next change of its needs or
	// applied records module by module (ComposeChanged); a node without
	// is composed whole.
	kept map[string]*Kept
	// notBefore holds, for each node of many records composed lately,
	// when it may be composed again (Share); entries go once past.
	notBefore map[string]time.Time
	// recordCost is the least a record has taken to compose in the
	// tenure; zero: none timed yet (planRecordCost).
	recordCost time.Duration
}

// plansSweep is how often the writer looks for the keys of nodes with no
// record left, whatever the copies' counts say (a node gone as another
// came, within one interval, leaves the count of nodes as it was), and
// names the providers' buckets of the nodes' compositions to the copy.
const plansSweep = time.Second

// Run keeps mesh-provisioner_plans until ctx is done: for each node,
// the digest of its composition (ComposeResponse.plan_digest) and the
// revisions it was composed at, written only when the digest differs from
// the one the bucket holds. It first brings every node's digest up to date
// (rewriting none that is), then, once the copy moves (and every interval
// for what it does not announce), composes again the nodes whose
// composition may have changed: those whose needs, applied records,
// collection items or providers' keys changed, and those whose last
// composition read a registry entry or a provider's manifest that changed;
// a node of many records no more often than Share says. The seat's holder
// runs it in its tenure, or, in a mesh whose instances serve some
// partitions each, every instance, for the nodes of the partitions whose
// seats it holds (Config.Holds); a write that meets another writer's (a
// revision it did not expect) is read again and retried, so two writers
// for a moment leave the bucket right.
//
// It returns when ctx is done, and ends on nothing the bus can cause: a
// watcher lost or a bucket unreachable is logged and tried again, each
// pass first bringing every digest up to date.
func Run(ctx context.Context, cfg Config) error {
	if cfg.KV == nil || cfg.JS == nil || cfg.Copy == nil || cfg.Ready == nil || cfg.Stats == nil || cfg.Logger == nil || cfg.Warnings == nil {
		return errors.New("plans: Config.KV, JS, Copy, Ready, Stats, Logger and Warnings are required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultInterval
	}
	if err := cfg.Ready(ctx); err != nil {
		return nil //nolint:nilerr // only ctx ends the wait
	}
	retry := backoff.New(backoff.Config{Min: plansRetryMin, Max: plansRetryMax, Factor: 2})
	for failures := 0; ; failures++ {
		err := keepPlans(ctx, cfg)
		if ctx.Err() != nil {
			return nil
		}
		var pause time.Duration // the first failure starts again at once
		if failures > 0 {
			pause = retry.Next()
		}
		cfg.Logger.Warn("keeping the plan digests; starting again", "bucket", cfg.KV.Bucket(), "err", err, "in", pause)
		if !backoff.Sleep(ctx, pause) {
			return nil
		}
	}
}

// How Run starts again after a run fails: at once after the first
// failure, then after pauses doubling from plansRetryMin to plansRetryMax,
// not jittered.
const (
	plansRetryMin = 100 * time.Millisecond
	plansRetryMax = 2 * time.Second
)

// keepPlans is one run of Run, until ctx is done or the bucket's
// watcher fails.
func keepPlans(ctx context.Context, cfg Config) error {
	w := &plansWriter{
		copy: cfg.Copy, holds: cfg.Holds, stats: cfg.Stats, warnings: cfg.Warnings, kv: cfg.KV, js: cfg.JS, interval: cfg.Interval, key: map[string]heldDigest{}, redo: map[string]bool{},
		buckets: map[string][]string{}, lastRead: map[string]nodeReads{}, writing: map[string]string{}, notBefore: map[string]time.Time{},
		kept: map[string]*Kept{},
	}
	watcher, err := cfg.KV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", cfg.KV.Bucket(), err)
	}
	defer kvread.Stop(watcher)
	if err := w.follow(ctx, watcher, true); err != nil {
		return err
	}
	followed := make(chan error, 1)
	go func() { followed <- w.follow(ctx, watcher, false) }()

	// The first pass: every node the copy knows, and every node the bucket
	// holds a digest of. Its garbage is about the size of the copy, and
	// the runtime would keep its pages for minutes, as the load's: they
	// go back to the system (mirror's releaseLoadMemory).
	var mark plansMark
	nodes, mark := w.changed(mark, true)
	if err := w.pass(ctx, nodes); err != nil {
		return err
	}
	debug.FreeOSMemory()
	ticker := time.NewTicker(cfg.Interval)
	defer ticker.Stop()
	// due fires when the first node put off may be composed.
	due := time.NewTimer(time.Hour)
	due.Stop()
	defer due.Stop()
	looked := time.Now()
	for {
		// A move heard during the last pass came while it ran: what came
		// with it is gathered already, as a settle would.
		movedMeanwhile := len(cfg.Copy.Moved()) > 0
		var wait time.Duration
		all := false // every node kept, not only those changed
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-followed:
			return fmt.Errorf("watch %s: %w", cfg.KV.Bucket(), err)
		case <-cfg.Copy.Moved():
			if !movedMeanwhile {
				wait = Settle
			}
		case <-ticker.C:
		case <-due.C:
		case <-cfg.HoldsChanged:
			all = true
		}
		// Looks are Settle apart at least, whatever woke this one: a node
		// too small to be put off (Share) is composed no more often.
		if !backoff.Sleep(ctx, max(wait, Settle-time.Since(looked))) {
			return ctx.Err()
		}
		looked = time.Now()
		nodes, mark = w.changed(mark, all)
		if err := w.pass(ctx, nodes); err != nil {
			return err
		}
		if all && len(nodes) > 0 {
			debug.FreeOSMemory() // as after the first pass: it composed every node kept
		}
		if until, ok := w.untilDue(); ok {
			due.Reset(until)
		} else {
			due.Stop()
		}
	}
}

// follow applies the plans bucket's changes to the writer's view: until
// the initial values are in when initial is set, else until the watcher
// stops.
func (w *plansWriter) follow(ctx context.Context, watcher jetstream.KeyWatcher, initial bool) error {
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-watcher.Updates():
			if !ok {
				return errors.New("the watcher stopped")
			}
			if e == nil {
				if initial {
					return nil
				}
				continue
			}
			w.mu.Lock()
			held, seen := w.key[e.Key()]
			switch {
			case e.Operation() != jetstream.KeyValuePut:
				delete(w.key, e.Key())
				w.redo[e.Key()] = true
			case !seen || held.revision < e.Revision():
				digest := &provisionerv1.PlanDigest{}
				if err := proto.Unmarshal(e.Value(), digest); err != nil {
					digest.Digest = "" // unreadable: rewritten on the next pass
					w.redo[e.Key()] = true
				}
				own, inFlight := w.writing[e.Key()]
				if seen && !initial && held.digest != digest.GetDigest() && (!inFlight || own != digest.GetDigest()) {
					w.redo[e.Key()] = true // another writer's: checked again
				}
				w.key[e.Key()] = heldDigest{digest: digest.GetDigest(), revision: e.Revision()}
			}
			w.mu.Unlock()
		}
	}
}

// plansMark is where the copies were when the writer last looked.
type plansMark struct {
	registry, needs, applied, collect, manifests, bound uint64
	// groups is how many nodes the three state buckets' copies held.
	groups int
}

// groupsOf counts the groups (nodes) of the copies of needs, applied
// records and items.
func groupsOf(m *mirror.Mirror) int {
	n := 0
	for _, c := range []mirror.Watched{m.Needs, m.Applied, m.Collect} {
		_, _, groups, _ := c.Counts()
		n += groups
	}
	return n
}

// changed returns the nodes whose composition may have changed since mark,
// in order, and the mark now; every node when all is set. A registry entry
// or a provider's manifest that changed composes again, of the nodes whose
// last composition read it, the modules whose needs name it.
func (w *plansWriter) changed(mark plansMark, all bool) ([]string, plansMark) {
	m := w.copy
	var next plansMark
	next.registry, _ = m.Registry.Stamp("")
	next.manifests, _ = m.Manifests.Stamp("")
	var kinds, providers []string
	if all || next.registry != mark.registry {
		kinds = w.registryChanged()
	}
	if all || next.manifests != mark.manifests {
		providers = w.manifestsChanged()
	}
	// set holds the nodes to compose; whole those whose change is not of
	// their needs or applied records alone (ComposeChanged); forget those
	// that read a registry entry or a manifest changed, whose modules
	// naming it are composed again (Kept.Forgetting).
	set, whole, forget := map[string]bool{}, map[string]bool{}, map[string]bool{}
	if !all && len(kinds)+len(providers) > 0 {
		w.mu.Lock()
		for node, r := range w.lastRead {
			if r.readsAny(kinds, providers) {
				set[node], forget[node] = true, true
			}
		}
		w.mu.Unlock()
	}
	since := mark
	if all {
		since = plansMark{}
	}
	var firsts []string
	firsts, next.needs = m.Needs.Changed(since.needs)
	addAll(set, firsts)
	firsts, next.applied = m.Applied.Changed(since.applied)
	addAll(set, firsts)
	firsts, next.collect = m.Collect.Changed(since.collect)
	addAll(set, firsts)
	addAll(whole, firsts)
	firsts, buckets, bound := m.Bound.Changed(since.bound)
	next.bound = bound
	for _, first := range firsts {
		// A provider's key of a node the mesh has, in a bucket its last
		// composition read: a provider writing keys of every node costs
		// compositions of its own consumers only.
		if w.known(first) && w.reads(first, buckets) {
			set[first], whole[first] = true, true
		}
	}
	next.groups = groupsOf(m)
	w.mu.Lock()
	if all || next.groups < mark.groups || time.Since(w.swept) >= plansSweep {
		// A node whose records are all gone has no group left to say so:
		// fewer groups remain, or, if another node came meanwhile, the
		// next sweep finds it. Nor has a node whose items, applied records
		// or needs alone are all gone (the copy names no group emptied):
		// it is composed whole once its groups differ from those of its
		// last composition.
		w.swept = time.Now()
		for node := range w.key {
			if !w.known(node) {
				set[node] = true
			}
		}
		for node, r := range w.lastRead {
			if r.groups != groupsHeld(m, node) {
				set[node], whole[node] = true, true
			}
		}
		for _, buckets := range w.buckets {
			for _, b := range buckets {
				m.Bound.Bucket(b)
			}
		}
	}
	if all {
		addAll(set, slices.Collect(maps.Keys(w.key)))
	}
	// A node to compose again for its key's sake (another writer's, a
	// write failed) or put off keeps what it kept: what composes it is
	// the copy, not the bucket; a change it was put off for that needs it
	// whole dropped it then, below.
	addAll(set, slices.Collect(maps.Keys(w.redo)))
	clear(w.redo)
	if w.holds != nil {
		// Another writer's nodes: their keys are read, never written.
		maps.DeleteFunc(set, func(node string, _ bool) bool { return !w.holds(node) })
	}
	if all {
		clear(w.kept)
	}
	for node := range whole {
		delete(w.kept, node)
	}
	for node := range forget {
		if kept := w.kept[node]; kept != nil {
			w.kept[node] = kept.Forgetting(kinds, providers)
		}
	}
	// A node put off stays to be composed: in redo until its time comes.
	now, deferred := time.Now(), 0
	for node, at := range w.notBefore {
		switch {
		case !now.Before(at):
			delete(w.notBefore, node)
		case set[node]:
			delete(set, node)
			w.redo[node] = true
			deferred++
			if left := at.Sub(now); left > w.interval { // a burst's pause is not worth a line
				w.warnings.Log(slog.LevelWarn, "plan deferred", node, "a node's plan digest is composed again later: it has many records and changes often",
					"in", left.Round(time.Millisecond))
			}
		}
	}
	w.stats.Deferred.Store(uint64(deferred))
	w.mu.Unlock()
	return slices.Sorted(maps.Keys(set)), next
}

// untilDue returns how long until the first node put off with a change
// waiting may be composed, if one is.
func (w *plansWriter) untilDue() (time.Duration, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	until, waiting := time.Duration(math.MaxInt64), false
	for node, at := range w.notBefore {
		if w.redo[node] {
			until, waiting = min(until, time.Until(at)), true
		}
	}
	return max(until, 0), waiting
}

// nodeReads are the registry entries (by kind) and the providers' manifests
// (by provider) a node's last composition read, each sorted.
type nodeReads struct {
	kinds, providers []string
	// groups are the copies that held records of the node before it was
	// composed (groupsHeld).
	groups uint8
}

// groupsHeld has a bit for each of the copies of needs, applied records and
// items that holds records of node.
func groupsHeld(m *mirror.Mirror, node string) uint8 {
	var held uint8
	for i, stamp := range []func(string) (uint64, uint64){m.Needs.Stamp, m.Applied.Stamp, m.Collect.Stamp} {
		if st, _ := stamp(node); st != 0 {
			held |= 1 << i
		}
	}
	return held
}

// readsAny reports whether r holds any of kinds or providers.
func (r nodeReads) readsAny(kinds, providers []string) bool {
	for _, k := range kinds {
		if _, ok := slices.BinarySearch(r.kinds, k); ok {
			return true
		}
	}
	for _, p := range providers {
		if _, ok := slices.BinarySearch(r.providers, p); ok {
			return true
		}
	}
	return false
}

// registryChanged returns the kinds whose registry entry changed (written,
// deleted, or out of shape now or before) since the writer last looked,
// and keeps their revisions for the next look. The registry holds tens
// of entries: comparing them all costs little, and misses no deletion.
func (w *plansWriter) registryChanged() []string {
	entries, _ := w.copy.Registry.All()
	now := make(map[string]uint64, len(entries))
	for _, e := range entries {
		now[e.Key] = e.Record.GetRevision() // zero for a malformed entry
	}
	changed := changedKeys(w.registry, now)
	w.registry = now
	return changed
}

// manifestsChanged is registryChanged for the providers' newest manifests,
// read from the index compositions read them through (one a provider).
func (w *plansWriter) manifestsChanged() []string {
	now := w.copy.ManifestRevisions()
	changed := changedKeys(w.manifests, now)
	w.manifests = now
	return changed
}

// changedKeys returns the keys whose values differ between before and now,
// or that either lacks, sorted.
func changedKeys(before, now map[string]uint64) []string {
	var changed []string
	for k, rev := range now {
		if was, ok := before[k]; !ok || was != rev {
			changed = append(changed, k)
		}
	}
	for k := range before {
		if _, ok := now[k]; !ok {
			changed = append(changed, k)
		}
	}
	slices.Sort(changed)
	return changed
}

// reads reports whether node's last composition read keys of any of
// buckets. A composition reads keys only of the buckets its needs name,
// and a node whose needs changed is composed for that change.
func (w *plansWriter) reads(node string, buckets []string) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, b := range w.buckets[node] {
		if slices.Contains(buckets, b) {
			return true
		}
	}
	return false
}

// known reports whether the copy holds any record of node.
func (w *plansWriter) known(node string) bool {
	m := w.copy
	for _, stamp := range []func(string) (uint64, uint64){m.Needs.Stamp, m.Applied.Stamp, m.Collect.Stamp} {
		if st, _ := stamp(node); st != 0 {
			return true
		}
	}
	return false
}

// union returns the sorted union of sorted a and b. What a node's modules
// composed alone read is added to what it read before: a module that no
// longer reads a name leaves it until the node is composed whole, which
// costs a composition of it at most.
func union(a, b []string) []string {
	if len(b) == 0 {
		return a
	}
	out := slices.Concat(a, b)
	slices.Sort(out)
	return slices.Compact(out)
}

func addAll(set map[string]bool, keys []string) {
	for _, k := range keys {
		set[k] = true
	}
}

// planWindow bounds the digests of a pass in flight, published and not yet
// acknowledged: under the JetStream's pending publishes' bound.
const planWindow = 16384

// pass brings the nodes' keys up to date in two steps: it composes every
// node (on as many workers as the process has cores), then writes the
// digests that changed; a node with no record left loses its key.
// Composing first keeps the notified nodes' requests for their
// compositions from slowing the composing of the rest: for a change that
// touches all of 1,000 plans, the last digest was written 1.5 s after the
// change when each node was written as soon as composed, and well within
// a second in two steps (make bench-plans). The digests are published
// with up to planWindow in flight (publish), each awaited only once that
// many more are out: the nodes notified first ask their compositions of
// the same cores, and digests awaited 64, then 1,024 at a time waited
// behind them.
func (w *plansWriter) pass(ctx context.Context, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	stats := w.stats
	start := time.Now()
	stats.Pending.Store(uint64(len(nodes)))
	defer func() {
		stats.Pending.Store(0)
		stats.LastPassMS.Store(uint64(time.Since(start).Milliseconds()))
	}()
	var (
		mu     sync.Mutex
		writes []planWrite
	)
	var composing errgroup.Group
	composing.SetLimit(runtime.GOMAXPROCS(0))
	for _, node := range nodes {
		if ctx.Err() != nil {
			break
		}
		composing.Go(func() error {
			if pw, ok := w.plan(node); ok {
				mu.Lock()
				writes = append(writes, pw)
				mu.Unlock()
			} else {
				stats.Pending.Add(^uint64(0))
			}
			return nil
		})
	}
	_ = composing.Wait() // plan reports its own failures
	// Up to planWindow digests are in flight at any time, each awaited
	// once planWindow more were published after it: a window drained
	// before the next is published left the connection idle while the
	// nodes told first asked their compositions, and took the cores.
	acks := make([]jetstream.PubAckFuture, len(writes))
	sent := make([]time.Time, len(writes))
	await := func(i int) {
		// An acknowledgement lost (the connection dropped while it was
		// out) is awaited no longer than a write's time from its send.
		awaiting, cancel := context.WithDeadline(ctx, sent[i].Add(planAckTimeout))
		defer cancel()
		w.acked(awaiting, writes[i], acks[i])
		acks[i] = nil
		stats.Pending.Add(^uint64(0))
	}
	published := 0
	for i, pw := range writes {
		if ctx.Err() != nil {
			break
		}
		if i >= planWindow {
			await(i - planWindow)
		}
		acks[i], sent[i] = w.publish(ctx, pw), time.Now()
		published++
	}
	for i := max(published-planWindow, 0); i < published; i++ {
		await(i)
	}
	return nil
}

// planAckTimeout bounds the wait for a digest's acknowledgement from its
// send: past it, a digest not acknowledged is written again on the next
// pass.
const planAckTimeout = 5 * time.Second

// planWrite is what a pass writes to one node's key.
type planWrite struct {
	node string
	held heldDigest // the key as the bucket holds it, if has
	has  bool
	// gone says the node has no record left: its key is deleted.
	gone      bool
	digest    string
	revisions *provisionerv1.Revisions
}

// plan composes node and returns what its key needs, if anything.
func (w *plansWriter) plan(node string) (planWrite, bool) {
	w.mu.Lock()
	held, has := w.key[node]
	w.mu.Unlock()
	if !w.known(node) {
		w.mu.Lock()
		delete(w.buckets, node)
		delete(w.lastRead, node)
		delete(w.kept, node)
		w.mu.Unlock()
		return planWrite{node: node, held: held, has: has, gone: true}, has
	}
	w.mu.Lock()
	kept := w.kept[node]
	w.mu.Unlock()
	// Read before composing: a group emptied meanwhile differs at the
	// next sweep.
	groups := groupsHeld(w.copy, node)
	start := time.Now()
	plan, next := ComposeChanged(w.copy, node, kept)
	took := time.Since(start)
	w.stats.Composed.Add(1)
	w.mu.Lock()
	// A record's cost is timed on whole compositions: one of a few
	// modules costs a fraction of its node's records.
	if kept == nil && plan.Records >= planCostSample {
		if cost := took / time.Duration(plan.Records); w.recordCost == 0 || cost < w.recordCost {
			w.recordCost = cost
		}
	}
	if pause := (Share - 1) * time.Duration(plan.Records) * cmp.Or(w.recordCost, planRecordCost); pause > Settle {
		w.notBefore[node] = start.Add(took + pause)
	}
	if kept != nil {
		// Of the modules composed alone: added to what the others read.
		was := w.lastRead[node]
		plan.Buckets = union(w.buckets[node], plan.Buckets)
		plan.Kinds, plan.Providers = union(was.kinds, plan.Kinds), union(was.providers, plan.Providers)
		plan.Revisions = w.copy.RevisionsNow().Only(plan.Buckets).Proto()
	}
	if len(plan.Buckets) > 0 {
		w.buckets[node] = plan.Buckets
	} else {
		delete(w.buckets, node)
	}
	w.lastRead[node] = nodeReads{kinds: plan.Kinds, providers: plan.Providers, groups: groups}
	if next != nil {
		w.kept[node] = next
	} else {
		delete(w.kept, node)
	}
	w.mu.Unlock()
	if has && held.digest == plan.Digest {
		return planWrite{}, false
	}
	return planWrite{node: node, held: held, has: has, digest: plan.Digest, revisions: plan.Revisions}, true
}

// publish publishes one node's digest, a compare-and-set on the revision
// the writer saw of its key (none: the key is made), without awaiting it,
// or deletes the key of a node gone (awaited); nil when nothing is left
// to await.
func (w *plansWriter) publish(ctx context.Context, pw planWrite) jetstream.PubAckFuture {
	if pw.gone {
		if err := w.kv.Delete(ctx, pw.node, jetstream.LastRevision(pw.held.revision)); err != nil && ctx.Err() == nil {
			w.failed(pw.node, "delete", err)
		}
		return nil
	}
	value, err := proto.MarshalOptions{Deterministic: true}.Marshal(&provisionerv1.PlanDigest{Digest: pw.digest, Revisions: pw.revisions})
	if err != nil {
		w.failed(pw.node, "encode", err)
		return nil
	}
	// The watcher may hear this write before it is acknowledged here: it
	// is the writer's own, not another's to check again.
	w.mu.Lock()
	w.writing[pw.node] = pw.digest
	w.mu.Unlock()
	msg := nats.NewMsg(wire.KVSubject(w.kv.Bucket(), pw.node))
	msg.Data = value
	ack, err := w.js.PublishMsgAsync(msg, jetstream.WithExpectLastSequencePerSubject(pw.held.revision))
	if err != nil {
		w.done(pw.node)
		if ctx.Err() == nil {
			w.failed(pw.node, "write", err)
		}
		return nil
	}
	return ack
}

// acked awaits a digest published (nil: none), until ctx is done, and
// keeps what the bucket now holds. A key made anew after a delete marker, which the writer does
// not follow, is made again as KeyValue.Create makes it.
func (w *plansWriter) acked(ctx context.Context, pw planWrite, ack jetstream.PubAckFuture) {
	if ack == nil {
		return
	}
	defer w.done(pw.node)
	var revision uint64
	select {
	case pa := <-ack.Ok():
		revision = pa.Sequence
	case err := <-ack.Err():
		var apiErr *jetstream.APIError
		if pw.has || !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
			w.failed(pw.node, "write", err)
			return
		}
		if revision, err = w.kv.Create(ctx, pw.node, ack.Msg().Data); err != nil {
			if ctx.Err() == nil {
				w.failed(pw.node, "write", err)
			}
			return
		}
	case <-ctx.Done():
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			w.failed(pw.node, "write", fmt.Errorf("no acknowledgement within %s", planAckTimeout))
		}
		return
	}
	w.mu.Lock()
	if w.key[pw.node].revision < revision {
		w.key[pw.node] = heldDigest{digest: pw.digest, revision: revision}
	}
	w.mu.Unlock()
	w.stats.Written.Add(1)
	w.stats.LastWritten.Store(time.Now().UnixNano())
}

// done ends a write of node's key in flight.
func (w *plansWriter) done(node string) {
	w.mu.Lock()
	delete(w.writing, node)
	w.mu.Unlock()
}

// failed counts a node's failed write and composes it again on the next
// pass: by then the watcher has brought the bucket's revision of its key.
func (w *plansWriter) failed(node, what string, err error) {
	w.stats.Failed.Add(1)
	w.mu.Lock()
	w.redo[node] = true
	w.mu.Unlock()
	// Not the node's doing (NATS failed): a line a minute, whichever node.
	w.warnings.Log(slog.LevelWarn, "plan not kept", "", "a node's plan digest was not kept; trying again", "node", node, "step", what, "err", err)
}

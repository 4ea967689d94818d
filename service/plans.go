package service

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/wire"
)

// DefaultPlansInterval is how often the plans' writer looks at what changed
// in the copy: changes within one interval are composed once.
const DefaultPlansInterval = 20 * time.Millisecond

// PlansConfig is what RunPlans needs.
type PlansConfig struct {
	// KV is the bucket mesh-provisioner_plans, bound by the identity that
	// writes it (permissions.ServerWriter). Required.
	KV jetstream.KeyValue
	// Interval is how often changes are looked for; zero means
	// DefaultPlansInterval.
	Interval time.Duration
}

// plansStats are RunPlans's counts, for the stats message.
type plansStats struct {
	written, composed, failed, pending, lastPassMS atomic.Uint64
	lastWritten                                    atomic.Int64 // unix nanoseconds; zero: none
}

func (p *plansStats) proto() *provisionerv1.PlansStats {
	out := &provisionerv1.PlansStats{
		Written: p.written.Load(), Composed: p.composed.Load(), Failed: p.failed.Load(),
		Pending: p.pending.Load(), LastPassMs: p.lastPassMS.Load(),
	}
	if at := p.lastWritten.Load(); at != 0 {
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
	s   *Service
	kv  jetstream.KeyValue
	mu  sync.Mutex
	key map[string]heldDigest // what the bucket holds, by node
	// redo are nodes whose key changed under the writer (deleted, or
	// written by another): composed again on the next pass.
	redo map[string]bool
}

// RunPlans keeps mesh-provisioner_plans until ctx is done: for each node,
// the digest of its composition (ComposeResponse.plan_digest) and the
// revisions it was composed at, written only when the digest differs from
// the one the bucket holds. It first brings every node's digest up to date
// (rewriting none that is), then, every interval, composes again the nodes
// whose composition may have changed: those whose needs, applied records,
// collection items or providers' keys changed, and every node when the
// registry or the manifests did. The seat's holder runs it in its tenure;
// a write that meets another writer's (a revision it did not expect) is
// read again and retried, so two writers for a moment leave the bucket
// right.
//
// It returns when ctx is done, and ends on nothing the bus can cause: a
// watcher lost or a bucket unreachable is logged and tried again, each
// pass first bringing every digest up to date.
func (s *Service) RunPlans(ctx context.Context, cfg PlansConfig) error {
	if cfg.KV == nil {
		return errors.New("service: PlansConfig.KV is required")
	}
	if cfg.Interval <= 0 {
		cfg.Interval = DefaultPlansInterval
	}
	if err := s.WaitReady(ctx); err != nil {
		return nil //nolint:nilerr // only ctx ends the wait
	}
	for retry := time.Duration(0); ; retry = min(max(2*retry, 100*time.Millisecond), 2*time.Second) {
		err := s.keepPlans(ctx, cfg)
		if ctx.Err() != nil {
			return nil
		}
		s.logger.Warn("keeping the plan digests; starting again", "bucket", cfg.KV.Bucket(), "err", err, "in", retry)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(retry):
		}
	}
}

// keepPlans is one run of RunPlans, until ctx is done or the bucket's
// watcher fails.
func (s *Service) keepPlans(ctx context.Context, cfg PlansConfig) error {
	w := &plansWriter{s: s, kv: cfg.KV, key: map[string]heldDigest{}, redo: map[string]bool{}}
	watcher, err := cfg.KV.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch %s: %w", cfg.KV.Bucket(), err)
	}
	defer func() { _ = watcher.Stop() }()
	if err := w.follow(ctx, watcher, true); err != nil {
		return err
	}
	followed := make(chan error, 1)
	go func() { followed <- w.follow(ctx, watcher, false) }()

	// The first pass: every node the copy knows, and every node the bucket
	// holds a digest of.
	var mark plansMark
	nodes, mark := w.changed(mark, true)
	ticker := time.NewTicker(cfg.Interval)
	defer ticker.Stop()
	for {
		if err := w.pass(ctx, nodes); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-followed:
			return fmt.Errorf("watch %s: %w", cfg.KV.Bucket(), err)
		case <-ticker.C:
		}
		nodes, mark = w.changed(mark, false)
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
				if seen && !initial && held.digest != digest.GetDigest() {
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
// in order, and the mark now; every node when all is set, or when the
// registry or the manifests changed.
func (w *plansWriter) changed(mark plansMark, all bool) ([]string, plansMark) {
	m := w.s.mirror
	var next plansMark
	next.registry, _ = m.Registry.Stamp("")
	next.manifests, _ = m.Manifests.Stamp("")
	all = all || next.registry != mark.registry || next.manifests != mark.manifests
	set := map[string]bool{}
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
	firsts, next.bound = m.Bound.Changed(since.bound)
	for _, first := range firsts {
		if w.known(first) { // a provider's key of a node the mesh has
			set[first] = true
		}
	}
	next.groups = groupsOf(m)
	w.mu.Lock()
	if all || next.groups < mark.groups {
		// A node whose records are all gone has no group left to say so;
		// only then do fewer groups remain (a node gone and another come
		// within one interval leaves the gone one's key until a tenure's
		// first pass).
		for node := range w.key {
			if !w.known(node) {
				set[node] = true
			}
		}
	}
	if all {
		addAll(set, slices.Collect(maps.Keys(w.key)))
	}
	addAll(set, slices.Collect(maps.Keys(w.redo)))
	clear(w.redo)
	w.mu.Unlock()
	return slices.Sorted(maps.Keys(set)), next
}

// known reports whether the copy holds any record of node.
func (w *plansWriter) known(node string) bool {
	m := w.s.mirror
	for _, stamp := range []func(string) (uint64, uint64){m.Needs.Stamp, m.Applied.Stamp, m.Collect.Stamp} {
		if st, _ := stamp(node); st != 0 {
			return true
		}
	}
	return false
}

func addAll(set map[string]bool, keys []string) {
	for _, k := range keys {
		set[k] = true
	}
}

// pass composes each node and writes the digests that changed, on as many
// workers as the process has cores; a node with no record left loses its
// key.
func (w *plansWriter) pass(ctx context.Context, nodes []string) error {
	if len(nodes) == 0 {
		return nil
	}
	stats := &w.s.plans
	start := time.Now()
	stats.pending.Store(uint64(len(nodes)))
	defer func() {
		stats.pending.Store(0)
		stats.lastPassMS.Store(uint64(time.Since(start).Milliseconds()))
	}()
	jobs := make(chan string)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(nodes)) {
		wg.Go(func() {
			for node := range jobs {
				w.keep(ctx, node)
				stats.pending.Add(^uint64(0))
			}
		})
	}
	defer wg.Wait()
	defer close(jobs)
	for _, node := range nodes {
		select {
		case jobs <- node:
		case <-ctx.Done():
			return nil
		}
	}
	return nil
}

// keep brings one node's key up to date.
func (w *plansWriter) keep(ctx context.Context, node string) {
	stats := &w.s.plans
	w.mu.Lock()
	held, has := w.key[node]
	w.mu.Unlock()
	if !w.known(node) {
		if has {
			if err := w.kv.Delete(ctx, node, jetstream.LastRevision(held.revision)); err != nil && ctx.Err() == nil {
				w.failed(node, "delete", err)
			}
		}
		return
	}
	digest, revisions, err := w.s.composeForPlans(node)
	stats.composed.Add(1)
	if err != nil {
		w.failed(node, "compose", err)
		return
	}
	if has && held.digest == digest {
		return
	}
	value, err := proto.MarshalOptions{Deterministic: true}.Marshal(&provisionerv1.PlanDigest{Digest: digest, Revisions: revisions})
	if err != nil {
		w.failed(node, "encode", err)
		return
	}
	var revision uint64
	if has {
		revision, err = w.kv.Update(ctx, node, value, held.revision)
	} else {
		revision, err = w.kv.Create(ctx, node, value)
	}
	if err != nil {
		if ctx.Err() == nil {
			w.failed(node, "write", err)
		}
		return
	}
	w.mu.Lock()
	if w.key[node].revision < revision {
		w.key[node] = heldDigest{digest: digest, revision: revision}
	}
	w.mu.Unlock()
	stats.written.Add(1)
	stats.lastWritten.Store(time.Now().UnixNano())
}

// composeForPlans composes node as the node asks on its own subject (the
// binary encoding, the first page), through the answer cache: the node's
// request that the digest's write prompts finds the answer built. It
// returns the composition's digest and revisions, read from the answer's
// bytes without decoding the rest.
func (s *Service) composeForPlans(node string) (digest string, revisions *provisionerv1.Revisions, err error) {
	ep := s.composeEndpoint()
	ep.name = wire.ComposeNodeEndpoint // the cache's key: a node's own requests
	data, werr := ep.respond(s, &provisionerv1.ComposeRequest{Node: node}, encoding{}, 0)
	if werr != nil {
		return "", nil, werr
	}
	revisions = &provisionerv1.Revisions{}
	digestField := (&provisionerv1.ComposeResponse{}).ProtoReflect().Descriptor().Fields().ByName("plan_digest").Number()
	revisionsField := (&provisionerv1.ComposeResponse{}).ProtoReflect().Descriptor().Fields().ByName("revisions").Number()
	for b := data; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return "", nil, protowire.ParseError(n)
		}
		b = b[n:]
		if typ == protowire.BytesType && (num == digestField || num == revisionsField) {
			v, m := protowire.ConsumeBytes(b)
			if m < 0 {
				return "", nil, protowire.ParseError(m)
			}
			if num == digestField {
				digest = string(v)
			} else if err := proto.Unmarshal(v, revisions); err != nil { // the tail's: the last one
				return "", nil, err
			}
			b = b[m:]
			continue
		}
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return "", nil, protowire.ParseError(m)
		}
		b = b[m:]
	}
	return digest, revisions, nil
}

// failed counts a node's failed write and composes it again on the next
// pass: by then the watcher has brought the bucket's revision of its key.
func (w *plansWriter) failed(node, what string, err error) {
	w.s.plans.failed.Add(1)
	w.mu.Lock()
	w.redo[node] = true
	w.mu.Unlock()
	w.s.planFailures.Do(func() {
		w.s.logger.Warn("a node's plan digest was not kept; trying again", "node", node, "step", what, "err", err)
	})
}

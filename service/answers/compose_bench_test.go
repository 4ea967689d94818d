package answers

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service/plans"
	"github.com/novox/mesh-provisioner/wire"
)

// The compose benchmarks read the capture named by MESH_COMPOSE_CAPTURE
// (written by mesh-provisioner capture) or, without it, a synthetic mesh of
// nodes of 60 modules x 25 needs, half of whose bound needs their providers
// have bound: 4 nodes for BenchmarkComposeNode, 1,000 for
// BenchmarkComposeMesh.
//
//	make bench
//	MESH_COMPOSE_CAPTURE=mesh.pb make bench

func benchCapture(b *testing.B, nodes int) *provisionerv1.Capture {
	b.Helper()
	if file := os.Getenv("MESH_COMPOSE_CAPTURE"); file != "" {
		data, err := os.ReadFile(file)
		if err != nil {
			b.Fatal(err)
		}
		capture := &provisionerv1.Capture{}
		if err := proto.Unmarshal(data, capture); err != nil {
			b.Fatalf("MESH_COMPOSE_CAPTURE=%s: %v", file, err)
		}
		return capture
	}
	capture, err := synth.Generate(synth.Config{Nodes: nodes, Modules: 60, Needs: 25, Bound: 50}).Capture(registry.Table())
	if err != nil {
		b.Fatal(err)
	}
	return capture
}

// nodesOf lists the nodes whose needs a capture holds.
func nodesOf(capture *provisionerv1.Capture) []string {
	seen := map[string]bool{}
	var nodes []string
	for _, bucket := range capture.GetBuckets() {
		if bucket.GetBucket() != keys.NeedsBucket {
			continue
		}
		for _, e := range bucket.GetEntries() {
			node, _, _ := strings.Cut(e.GetKey(), ".")
			if !seen[node] {
				seen[node] = true
				nodes = append(nodes, node)
			}
		}
	}
	slices.Sort(nodes)
	return nodes
}

// perNode holds the ns per node each composer measured, for the ratio.
var perNode sync.Map

func BenchmarkComposeNode(b *testing.B) {
	capture := benchCapture(b, 4)
	nodes := nodesOf(capture)
	replay, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	needs := 0
	for _, n := range nodes {
		entries, _, _ := replay.mirror.Needs.Group(n)
		needs += len(entries)
	}
	b.Logf("%d nodes, %d needs per node on average", len(nodes), needs/max(len(nodes), 1))
	for _, n := range nodes { // order each node's keys, as the first composition after a change does
		if _, err := replay.Compose(&provisionerv1.ComposeRequest{Node: n}); err != nil {
			b.Fatal(err)
		}
	}

	b.Run("watched", func(b *testing.B) {
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := replay.Compose(&provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]}); err != nil {
				b.Fatal(err)
			}
			i++
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(i)
		b.ReportMetric(ns, "ns/node")
		perNode.Store("watched", ns)
	})

	// As the verb and the plans writer compose: in an arena reused once
	// the answer is encoded or its digest read.
	b.Run("watched, arena reused", func(b *testing.B) {
		b.ReportAllocs()
		arena := new(compose.Arena)
		i := 0
		for b.Loop() {
			if _, _, werr := composeFrom(replay.mirror, &provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]}, Encoding{}, unpaged, reading{views: keepViews, arena: arena}); werr != nil {
				b.Fatal(werr)
			}
			arena.Reset()
			i++
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(i)
		b.ReportMetric(ns, "ns/node")
		perNode.Store("watched, arena reused", ns)
	})

	// As the verb answers a whole node that it has not answered since
	// what the node's composition reads changed: composed, digested and
	// encoded whole, or a module at a time into sections (nothing kept to
	// reuse: a cache of its own each time).
	for _, enc := range []Encoding{{}, {json: true}} {
		name := enc.ContentType()
		b.Run("encoded whole, "+name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				arena, done := pooledArena()
				out, _, werr := composeFrom(replay.mirror, &provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]}, Encoding{}, Budget{Fill: 1 << 30, Most: 1 << 30}, reading{views: keepViews, arena: arena})
				if werr != nil {
					b.Fatal(werr)
				}
				if _, err := enc.Marshal(out); err != nil {
					b.Fatal(err)
				}
				done()
				i++
			}
			perNode.Store("encoded whole, "+name, float64(b.Elapsed().Nanoseconds())/float64(i))
		})
		b.Run("encoded in sections, "+name, func(b *testing.B) {
			b.ReportAllocs()
			s := &Answers{mirror: replay.mirror}
			i := 0
			for b.Loop() {
				// A cache that noted the node asked once, and holds
				// nothing else.
				s.sections = newSectionCache(64 << 20)
				req := &provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]}
				s.sections.put(sectionsKey{node: req.GetNode(), json: enc.json}, &nodeSections{stamp: sectionStampOf(replay.mirror, req.GetNode())})
				if _, _, ok := s.composeSections(req, enc, Budget{Fill: 1 << 30, Most: 1 << 30}); !ok {
					b.Fatal("not composed in sections")
				}
				i++
			}
			perNode.Store("encoded in sections, "+name, float64(b.Elapsed().Nanoseconds())/float64(i))
		})
	}

	b.Run("by-key", func(b *testing.B) {
		ctx := context.Background()
		js := restore(b, capture)
		byKey, err := newByKeyComposer(ctx, js)
		if err != nil {
			b.Fatal(err)
		}
		// The by-key composer must compose what the watched copy does.
		for _, n := range nodes[:1] {
			got, err := byKey.compose(ctx, n)
			if err != nil {
				b.Fatal(err)
			}
			want, err := replay.Compose(&provisionerv1.ComposeRequest{Node: n})
			if err != nil {
				b.Fatal(err)
			}
			got.Phases, want.Phases = nil, nil
			got.Revisions, want.Revisions = nil, nil
			if !proto.Equal(got, want) {
				b.Fatalf("the by-key composer composes %s otherwise than the watched copy", n)
			}
		}
		b.ResetTimer()
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			if _, err := byKey.compose(ctx, nodes[i%len(nodes)]); err != nil {
				b.Fatal(err)
			}
			i++
		}
		ns := float64(b.Elapsed().Nanoseconds()) / float64(i)
		b.ReportMetric(ns, "ns/node")
		perNode.Store("by-key", ns)
	})

	watched, ok1 := perNode.Load("watched")
	byKey, ok2 := perNode.Load("by-key")
	if ok1 && ok2 {
		fmt.Printf("BenchmarkComposeNode: per node, by-key %s; watched copy %s (%.0fx faster)\n",
			time.Duration(byKey.(float64)), time.Duration(watched.(float64)), byKey.(float64)/watched.(float64))
	}
	for _, enc := range []Encoding{{}, {json: true}} {
		whole, ok3 := perNode.Load("encoded whole, " + enc.ContentType())
		if sections, ok := perNode.Load("encoded in sections, " + enc.ContentType()); ok3 && ok {
			fmt.Printf("BenchmarkComposeNode: per node in %s, encoded whole %s; in sections, nothing kept %s (x%.2f)\n", enc.ContentType(),
				time.Duration(whole.(float64)), time.Duration(sections.(float64)), sections.(float64)/whole.(float64))
		}
	}
	if reused, ok := perNode.Load("watched, arena reused"); ok1 && ok {
		fmt.Printf("BenchmarkComposeNode: per node, watched copy %s; in an arena reused %s (x%.2f)\n",
			time.Duration(watched.(float64)), time.Duration(reused.(float64)), reused.(float64)/watched.(float64))
	}
}

func BenchmarkComposeMesh(b *testing.B) {
	capture := benchCapture(b, 1000)
	nodes := nodesOf(capture)
	replay, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	// One pass first, timed apart: the first composition of a loaded node
	// also decodes its keys (and orders them, while loading left some out
	// of order), which later passes do only for nodes that changed or
	// whose decoded view was dropped.
	first := time.Now()
	for _, n := range nodes {
		if _, err := replay.Compose(&provisionerv1.ComposeRequest{Node: n}); err != nil {
			b.Fatal(err)
		}
	}
	firstRun := time.Since(first)
	// The first pass as the plans writer makes it, on a copy loaded alike:
	// as many nodes at once as there are cores, each digested in a pooled
	// scratch (plans.Compose), no view kept. Its digests are the answers'.
	writer, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	digests := make([]string, len(nodes))
	first = time.Now()
	var composing errgroup.Group
	composing.SetLimit(runtime.GOMAXPROCS(0))
	for i, n := range nodes {
		composing.Go(func() error {
			digests[i] = plans.Compose(writer.mirror, n).Digest
			return nil
		})
	}
	_ = composing.Wait()
	writerRun := time.Since(first)
	// What that first pass reads, alone, on a copy loaded alike: every
	// node's needs and items decoded, and its applied records' builds,
	// nothing composed.
	// The copy keeps each key as its bytes (the memory target), so the
	// first pass decodes every value once: this is that pass's floor.
	writer = nil
	decoded, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	runtime.GC() // not the first pass's garbage: the decoding's own
	first = time.Now()
	var decoding errgroup.Group
	decoding.SetLimit(runtime.GOMAXPROCS(0))
	for _, n := range nodes {
		decoding.Go(func() error {
			var needs mirror.Scratch[*provisionerv1.NeedRecord]
			var collect mirror.Scratch[*provisionerv1.CollectRecord]
			decoded.mirror.Needs.GroupInto(n, &needs)
			decoded.mirror.Collect.GroupInto(n, &collect)
			decoded.mirror.BuildsOf(n)
			return nil
		})
	}
	_ = decoding.Wait()
	decodeRun := time.Since(first)
	decoded = nil
	// The writer's digests are the answers'.
	for i, n := range nodes {
		c, err := replay.Compose(&provisionerv1.ComposeRequest{Node: n})
		if err != nil {
			b.Fatal(err)
		}
		if c.GetPlanDigest() != digests[i] {
			b.Fatalf("the plans writer digests %s as %s, its composition as %s", n, digests[i], c.GetPlanDigest())
		}
	}
	runtime.GC() // not the loading's garbage: the compositions' own
	b.ReportAllocs()
	for b.Loop() {
		for _, n := range nodes {
			if _, err := replay.Compose(&provisionerv1.ComposeRequest{Node: n}); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(len(nodes)), "nodes")
	b.ReportMetric(firstRun.Seconds(), "s/first-run")
	b.ReportMetric(writerRun.Seconds(), fmt.Sprintf("s/first-run-on-%d-cores", runtime.GOMAXPROCS(0)))
	b.ReportMetric(decodeRun.Seconds(), fmt.Sprintf("s/decode-only-on-%d-cores", runtime.GOMAXPROCS(0)))
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(nodes)), "ns/node")
}

// restore writes a capture into the buckets of a fresh embedded server.
func restore(b *testing.B, capture *provisionerv1.Capture) jetstream.JetStream {
	b.Helper()
	ctx := context.Background()
	nc := natstest.Connect(b, natstest.Start(b))
	js, err := jetstream.New(nc)
	if err != nil {
		b.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		b.Fatal(err)
	}
	for _, bucket := range capture.GetBuckets() {
		if strings.HasSuffix(bucket.GetBucket(), wire.BoundSuffix) { // a provider's, which it makes
			if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket.GetBucket()}); err != nil {
				b.Fatal(err)
			}
		}
		for _, e := range bucket.GetEntries() {
			if _, err := js.PublishAsync(wire.KVSubject(bucket.GetBucket(), e.GetKey()), e.GetValue()); err != nil {
				b.Fatal(err)
			}
		}
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("restoring the capture took over a minute")
	}
	return js
}

// byKeyComposer is the baseline: it reads every key a composition needs from
// JetStream, one Get at a time, as provisioner composers did before a
// watched copy: the node's needs, items and applied records, the registry
// entry of each kind, and for each provision its provider's manifests and
// its key in the provider's bucket. It lives in this benchmark only.
type byKeyComposer struct {
	js                                          jetstream.JetStream
	registry, needs, collect, applied, manifest jetstream.KeyValue
}

func newByKeyComposer(ctx context.Context, js jetstream.JetStream) (*byKeyComposer, error) {
	c := &byKeyComposer{js: js}
	var err error
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{keys.RegistryBucket, &c.registry}, {keys.NeedsBucket, &c.needs}, {keys.CollectBucket, &c.collect}, {keys.AppliedBucket, &c.applied}, {keys.ManifestsBucket, &c.manifest}} {
		if *b.kv, err = js.KeyValue(ctx, b.name); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *byKeyComposer) compose(ctx context.Context, node string) (*provisionerv1.ComposeResponse, error) {
	// Each key is read with its own Get into a capture of what the
	// composition reads, which a mirror then holds as the copy would.
	read := map[string]*provisionerv1.CapturedBucket{}
	get := func(kv jetstream.KeyValue, bucket, key string) (bool, error) {
		e, err := kv.Get(ctx, key)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		if read[bucket] == nil {
			read[bucket] = &provisionerv1.CapturedBucket{Bucket: bucket}
		}
		read[bucket].Entries = append(read[bucket].Entries, &provisionerv1.CapturedEntry{Key: key, Value: e.Value(), Revision: e.Revision()})
		return true, nil
	}
	for _, b := range []struct {
		kv     jetstream.KeyValue
		bucket string
	}{{c.needs, keys.NeedsBucket}, {c.collect, keys.CollectBucket}, {c.applied, keys.AppliedBucket}} {
		keys, err := listKeys(ctx, b.kv, node+".>")
		if err != nil {
			return nil, err
		}
		for _, key := range keys {
			if _, err := get(b.kv, b.bucket, key); err != nil {
				return nil, err
			}
		}
	}
	needs, err := mirror.Load(&provisionerv1.Capture{Buckets: []*provisionerv1.CapturedBucket{read[keys.NeedsBucket]}})
	if err != nil {
		return nil, err
	}
	entries, _, _ := needs.Needs.Group(node)
	kinds, providers := map[string]bool{}, map[string]bool{}
	for _, e := range entries {
		if e.Malformed != nil {
			continue
		}
		if kind := e.Record.GetKind(); !kinds[kind] {
			kinds[kind] = true
			if _, err := get(c.registry, keys.RegistryBucket, kind); err != nil {
				return nil, err
			}
		}
		if p := e.Record.GetNeed().GetProvider(); p != "" && !providers[p] && keys.CheckToken(p) == nil {
			providers[p] = true
			manifests, err := listKeys(ctx, c.manifest, "*."+p)
			if err != nil {
				return nil, err
			}
			for _, key := range manifests {
				if _, err := get(c.manifest, keys.ManifestsBucket, key); err != nil {
					return nil, err
				}
			}
		}
	}
	// The provisions' keys, each read in its provider's bucket.
	pending, err := mirror.Load(&provisionerv1.Capture{Buckets: slices.Collect(maps.Values(read))})
	if err != nil {
		return nil, err
	}
	first, _, werr := composeFrom(pending, &provisionerv1.ComposeRequest{Node: node}, Encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		return nil, werr
	}
	bound := map[string]jetstream.KeyValue{}
	for _, p := range first.GetProvisions() {
		kv, ok := bound[p.GetBucket()]
		if !ok {
			if kv, err = c.js.KeyValue(ctx, p.GetBucket()); errors.Is(err, jetstream.ErrBucketNotFound) {
				kv, err = nil, nil
			}
			if err != nil {
				return nil, err
			}
			bound[p.GetBucket()] = kv
		}
		if kv != nil {
			if _, err := get(kv, p.GetBucket(), p.GetKey()); err != nil {
				return nil, err
			}
		}
	}
	m, err := mirror.Load(&provisionerv1.Capture{Buckets: slices.Collect(maps.Values(read))})
	if err != nil {
		return nil, err
	}
	out, _, werr := composeFrom(m, &provisionerv1.ComposeRequest{Node: node}, Encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		return nil, werr
	}
	return out, nil
}

// listKeys lists the keys of a bucket that filter matches, in key order.
func listKeys(ctx context.Context, kv jetstream.KeyValue, filter string) ([]string, error) {
	lister, err := kv.ListKeysFiltered(ctx, filter)
	if err != nil {
		return nil, err
	}
	var out []string
	for k := range lister.Keys() {
		out = append(out, k)
	}
	slices.Sort(out)
	return out, nil
}

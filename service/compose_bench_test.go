package service

import (
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/natstest"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
)

// The compose benchmarks read the capture named by MESH_COMPOSE_CAPTURE
// (written by mesh-provisioner capture) or, without it, a synthetic mesh of
// nodes of 60 modules x 25 needs: 4 nodes for BenchmarkComposeNode, 1,000 for
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
	capture, err := synth.Generate(synth.Config{Nodes: nodes, Modules: 60, Needs: 25}).Capture(registry.Table())
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
		v, _, _ := replay.mirror.needs.groupOf(n)
		needs += len(v.records)
	}
	b.Logf("%d nodes, %d needs per node on average", len(nodes), needs/max(len(nodes), 1))
	for _, n := range nodes { // order each node's keys, as the first composition after a change does
		replay.Compose(&provisionerv1.ComposeRequest{Node: n})
	}

	// cold resolves every need, as the first composition after a node's
	// needs changed does; warm reuses what the node's last composition
	// resolved, as a composition of an unchanged node does.
	for _, mode := range []struct {
		name  string
		reuse bool
	}{{"watched-cold", false}, {"watched-warm", true}} {
		b.Run(mode.name, func(b *testing.B) {
			b.ReportAllocs()
			i := 0
			for b.Loop() {
				replay.mirror.compose(&provisionerv1.ComposeRequest{Node: nodes[i%len(nodes)]}, 0, mode.reuse)
				i++
			}
			ns := float64(b.Elapsed().Nanoseconds()) / float64(i)
			b.ReportMetric(ns, "ns/node")
			perNode.Store(mode.name, ns)
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
			want := replay.Compose(&provisionerv1.ComposeRequest{Node: n})
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

	cold, ok1 := perNode.Load("watched-cold")
	warm, ok2 := perNode.Load("watched-warm")
	byKey, ok3 := perNode.Load("by-key")
	if ok1 && ok2 && ok3 {
		fmt.Printf("BenchmarkComposeNode: per node, by-key %s; watched copy %s cold (%.0fx faster), %s warm (%.0fx faster)\n",
			time.Duration(byKey.(float64)), time.Duration(cold.(float64)), byKey.(float64)/cold.(float64),
			time.Duration(warm.(float64)), byKey.(float64)/warm.(float64))
	}
}

func BenchmarkComposeMesh(b *testing.B) {
	capture := benchCapture(b, 1000)
	nodes := nodesOf(capture)
	replay, err := NewReplay(capture)
	if err != nil {
		b.Fatal(err)
	}
	capture = nil // let the encoded copy go: the replay holds the mesh
	// One pass first: a node's first composition after a change orders its
	// keys, which the watched copy does once per change, not per composition.
	for _, n := range nodes {
		replay.Compose(&provisionerv1.ComposeRequest{Node: n})
	}
	runtime.GC() // not the loading's garbage: the compositions' own
	for _, mode := range []struct {
		name  string
		reuse bool
	}{{"cold", false}, {"warm", true}} {
		b.Run(mode.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, n := range nodes {
					replay.mirror.compose(&provisionerv1.ComposeRequest{Node: n}, 0, mode.reuse)
				}
			}
			b.ReportMetric(float64(len(nodes)), "nodes")
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(nodes)), "ns/node")
		})
	}
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
	if err := EnsureBuckets(ctx, js, 1); err != nil {
		b.Fatal(err)
	}
	for _, bucket := range capture.GetBuckets() {
		for _, e := range bucket.GetEntries() {
			if _, err := js.PublishAsync("$KV."+bucket.GetBucket()+"."+e.GetKey(), e.GetValue()); err != nil {
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
// watched copy. It lives in this benchmark only.
type byKeyComposer struct {
	registry, needs, collect jetstream.KeyValue
}

func newByKeyComposer(ctx context.Context, js jetstream.JetStream) (*byKeyComposer, error) {
	c := &byKeyComposer{}
	var err error
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{keys.RegistryBucket, &c.registry}, {keys.NeedsBucket, &c.needs}, {keys.CollectBucket, &c.collect}} {
		if *b.kv, err = js.KeyValue(ctx, b.name); err != nil {
			return nil, err
		}
	}
	return c, nil
}

func (c *byKeyComposer) compose(ctx context.Context, node string) (*provisionerv1.ComposeResponse, error) {
	in := compose.Input{Node: node}
	needKeys, err := listKeys(ctx, c.needs, node)
	if err != nil {
		return nil, err
	}
	for _, key := range needKeys {
		e, err := c.needs.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		if r, err := decodeNeed(key, e.Value(), e.Revision()); err != nil {
			in.Malformed = append(in.Malformed, &provisionerv1.MalformedKey{Bucket: keys.NeedsBucket, Key: key, Reason: err.Error(), Revision: e.Revision()})
		} else {
			in.Needs = append(in.Needs, r)
		}
	}
	itemKeys, err := listKeys(ctx, c.collect, node)
	if err != nil {
		return nil, err
	}
	for _, key := range itemKeys {
		e, err := c.collect.Get(ctx, key)
		if err != nil {
			return nil, err
		}
		if r, err := decodeCollect(key, e.Value(), e.Revision()); err == nil {
			in.Items = append(in.Items, r)
		}
	}
	var lookupErr error
	in.Registry = func(kind string) *provisionerv1.RegistryEntry {
		e, err := c.registry.Get(ctx, kind)
		if err != nil {
			if !errors.Is(err, jetstream.ErrKeyNotFound) {
				lookupErr = err
			}
			return nil
		}
		r, err := decodeRegistry(kind, e.Value(), e.Revision())
		if err != nil {
			return nil
		}
		return r.GetEntry()
	}
	out, _ := compose.Compose(in)
	return out, lookupErr
}

// listKeys lists a node's keys of a bucket, in key order.
func listKeys(ctx context.Context, kv jetstream.KeyValue, node string) ([]string, error) {
	lister, err := kv.ListKeysFiltered(ctx, node+".>")
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

// Package synth makes a realistic synthetic mesh: nodes whose modules need a
// value of every kind the registry answers (and a few it does not), with
// collection items, applied records and a few malformed keys, and, as
// configured, modules between two builds and providers with manifests and
// bound entries; the same for the same configuration. mesh-provisioner simulate writes one into a live
// NATS; the compose benchmark composes one.
package synth

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Config sizes a mesh.
type Config struct {
	// Nodes, Modules per node and Needs per module.
	Nodes, Modules, Needs int
	// Seed makes a different mesh of the same size.
	Seed uint64
	// Builds is the percentage of modules between two builds: wanted b1
	// and newest b2, with half of their needs in both, a quarter in b1
	// only and a quarter in b2 only. Zero: no module names a build.
	Builds int
	// Bound is the percentage of bound needs whose provider has bound
	// them. When it is set, the first node runs every provider and writes
	// its manifest, which offers every provision but one (each module's
	// need of it is refused as not offered).
	Bound int
}

// NotOffered is the provision no synthetic provider's manifest offers.
const NotOffered = "db1"

// Mesh is a synthetic mesh, node by node, and what its providers hold.
type Mesh struct {
	Nodes []Node
	// Bound are the keys the providers have bound, in their buckets, by
	// bucket then key (the value is the provider's, opaque here).
	Bound []Raw
}

// Node is one node's state, as its provisioner client would write it.
type Node struct {
	Name    string
	Needs   []Need
	Applied []Applied
	Items   []Item
	// Manifests are those of the providers the node runs.
	Manifests []Manifest
	// Malformed are keys out of shape, by bucket, with the bytes stored.
	Malformed []Raw
}

// Need is one need of a module.
type Need struct {
	Module, Kind, Name string
	Need               *provisionerv1.Need
}

// Applied is what is applied of a module.
type Applied struct {
	Module  string
	Applied *provisionerv1.Applied
}

// Manifest is what a provider offers.
type Manifest struct {
	Provider string
	Manifest *provisionerv1.Manifest
}

// Item is a module's item of a collection.
type Item struct {
	Collection, Contributor string
	Item                    *provisionerv1.CollectItem
}

// Raw is a key written as it is, value and all.
type Raw struct {
	Bucket, Key string
	Value       []byte
}

var (
	moduleNames = []string{"web", "api", "worker", "db", "cache", "auth", "billing", "search", "mail", "queue", "metrics", "logs", "gateway", "scheduler", "storage"}
	providers   = []string{"pg", "redis", "s3", "kafka"}
	// kinds weighs the kinds of a module's needs: ports, configuration and
	// secrets most, collections and placement often, rare kinds rarely.
	kinds = []string{
		"port", "port", "port", "config", "config", "config", "config", "secret", "secret",
		"dir", "dir", "bound", "bound", "environment", "shell", "contribution", "collected",
		"access", "seat", "machine", "consumers",
	}
)

// Generate makes a mesh. About one need in a hundred cannot be resolved (an
// unknown kind, a bound need without a provider), and each node has three
// malformed keys.
func Generate(cfg Config) *Mesh {
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x6d657368))
	// Builds and bound keys are drawn apart: a mesh with them is the same
	// mesh as without, but for them.
	builds := rand.New(rand.NewPCG(cfg.Seed, 0x6275696c6473))
	binds := rand.New(rand.NewPCG(cfg.Seed, 0x626f756e64))
	at := timestamppb.New(time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC))
	mesh := &Mesh{Nodes: make([]Node, cfg.Nodes)}
	for n := range mesh.Nodes {
		node := &mesh.Nodes[n]
		node.Name = fmt.Sprintf("node-%04d", n)
		for m := range cfg.Modules {
			module := moduleNames[m%len(moduleNames)]
			if m >= len(moduleNames) {
				module = fmt.Sprintf("%s-%d", module, m/len(moduleNames))
			}
			var placeholders []string
			used := map[string]bool{}
			betweenBuilds := builds.IntN(100) < cfg.Builds
			for i := range cfg.Needs {
				need := makeNeed(rng, module, i, used)
				if betweenBuilds {
					switch i % 4 {
					case 1:
						need.Need.Builds = []string{"b1"}
					case 3:
						need.Need.Builds = []string{"b2"}
					}
				}
				node.Needs = append(node.Needs, need)
				placeholders = append(placeholders, need.Need.GetPlaceholder())
			}
			applied := &provisionerv1.Applied{PlanDigest: fmt.Sprintf("sha256:%016x", rng.Uint64()), AppliedAt: at, Placeholders: placeholders}
			if betweenBuilds {
				applied.WantedBuild, applied.NewestBuild = "b1", "b2"
			}
			node.Applied = append(node.Applied, Applied{Module: module, Applied: applied})
			node.Items = append(node.Items,
				Item{Collection: "shell:zsh:normal", Contributor: module, Item: &provisionerv1.CollectItem{Value: "export " + module + "_HOME=/srv/" + module, Order: int32(m)}},
				Item{Collection: "environment:" + module, Contributor: module, Item: &provisionerv1.CollectItem{Value: "ENV=production"}},
				Item{Collection: "plugins", Contributor: module, Item: &provisionerv1.CollectItem{Value: module, Attributes: map[string]string{"version": "1"}}},
			)
		}
		if cfg.Bound > 0 {
			mesh.bind(binds, node, cfg.Bound)
		}
		node.Malformed = []Raw{
			{keys.NeedsBucket, node.Name + ".web.port", []byte{}},
			{keys.NeedsBucket, node.Name + ".web.config.broken", []byte{0xff, 0xff, 0xff}},
			{keys.CollectBucket, node.Name + ".shell=3a.web", []byte{}},
		}
	}
	if cfg.Bound > 0 && len(mesh.Nodes) > 0 {
		first := &mesh.Nodes[0]
		for _, provider := range providers {
			offers := make([]*provisionerv1.Offer, 0, cfg.Needs)
			for i := range cfg.Needs {
				if provision := fmt.Sprintf("db%d", i); provision != NotOffered {
					offers = append(offers, &provisionerv1.Offer{Provision: provision})
				}
			}
			first.Manifests = append(first.Manifests, Manifest{Provider: provider, Manifest: &provisionerv1.Manifest{
				Offers: offers, Attributes: map[string]string{"version": "1", "engine": provider},
			}})
		}
	}
	slices.SortFunc(mesh.Bound, func(a, b Raw) int { return cmp.Or(cmp.Compare(a.Bucket, b.Bucket), cmp.Compare(a.Key, b.Key)) })
	return mesh
}

// bind has the providers bind percent of the node's bound needs, at the
// key the registry's bound entry renders (<node>.<module>.<provision>
// [.<local>]) in <provider>_bound.
func (m *Mesh) bind(rng *rand.Rand, node *Node, percent int) {
	for _, n := range node.Needs {
		provider := n.Need.GetProvider()
		if n.Kind != "bound" || provider == "" || rng.IntN(100) >= percent {
			continue
		}
		key := node.Name + "." + n.Module + "." + cmp.Or(n.Need.GetProvision(), n.Name)
		if n.Need.GetLocal() != "" {
			key += "." + n.Need.GetLocal()
		}
		m.Bound = append(m.Bound, Raw{Bucket: wire.BoundBucket(provider), Key: key, Value: []byte("bound")})
	}
}

// makeNeed makes the i-th need of a module; used holds the module's need
// keys so far (kind and name), which stay distinct.
func makeNeed(rng *rand.Rand, module string, i int, used map[string]bool) Need {
	kind := kinds[rng.IntN(len(kinds))]
	name := fmt.Sprintf("%s%d", kind, i)
	n := &provisionerv1.Need{Required: rng.IntN(4) > 0}
	switch kind {
	case "bound":
		n.Provider = providers[rng.IntN(len(providers))]
		n.Provision = fmt.Sprintf("db%d", i)
		if rng.IntN(3) == 0 {
			n.Local = "ro"
		}
	case "shell":
		name = "zsh:normal"
	case "environment":
		name = module
	case "collected":
		name = "plugins"
	}
	switch rng.IntN(100) {
	case 0:
		kind, name = "gpu", fmt.Sprintf("cuda%d", i) // no domain answers it
	case 1:
		kind, n.Provider = "bound", "" // a bound need without its provider
	}
	if used[kind+"."+name] {
		name = fmt.Sprintf("%s-%d", name, i) // a second need of one collection reads another
	}
	used[kind+"."+name] = true
	n.Placeholder = "${" + kind + ":" + name + "}"
	return Need{Module: module, Kind: kind, Name: name, Need: n}
}

// Capture returns the mesh as a capture of the provisioning buckets, with
// the registry given, revisions numbered in write order per bucket.
func (m *Mesh) Capture(registry []*provisionerv1.RegistryEntry) (*provisionerv1.Capture, error) {
	buckets := map[string]*provisionerv1.CapturedBucket{}
	var order []*provisionerv1.CapturedBucket
	for _, name := range keys.Buckets() {
		b := &provisionerv1.CapturedBucket{Bucket: name}
		buckets[name] = b
		order = append(order, b)
	}
	add := func(bucket, key string, value []byte) {
		b := buckets[bucket]
		b.Revision++
		b.Entries = append(b.Entries, &provisionerv1.CapturedEntry{Key: key, Value: value, Revision: b.GetRevision()})
	}
	marshal := proto.MarshalOptions{Deterministic: true}
	for _, e := range registry {
		v, err := marshal.Marshal(e)
		if err != nil {
			return nil, err
		}
		add(keys.RegistryBucket, e.GetKind(), v)
	}
	err := m.each(func(node *Node, bucket, key string, value proto.Message, raw []byte) error {
		if value != nil {
			var err error
			if raw, err = marshal.Marshal(value); err != nil {
				return err
			}
		}
		add(bucket, key, raw)
		return nil
	})
	// A provider's bucket as the server holds it: keys and revisions.
	for _, r := range m.Bound {
		if _, ok := buckets[r.Bucket]; !ok {
			buckets[r.Bucket] = &provisionerv1.CapturedBucket{Bucket: r.Bucket}
			order = append(order, buckets[r.Bucket])
		}
		add(r.Bucket, r.Key, nil)
	}
	return &provisionerv1.Capture{CapturedAt: timestamppb.Now(), Buckets: order}, err
}

// each calls fn for every key of the mesh in write order: per node, needs,
// applied records, items, then the malformed keys (value nil, raw set).
func (m *Mesh) each(fn func(node *Node, bucket, key string, value proto.Message, raw []byte) error) error {
	for i := range m.Nodes {
		node := &m.Nodes[i]
		for _, n := range node.Needs {
			key, err := keys.NeedKey{Node: node.Name, Module: n.Module, Kind: n.Kind, Name: n.Name}.Key()
			if err != nil {
				return err
			}
			if err := fn(node, keys.NeedsBucket, key, n.Need, nil); err != nil {
				return err
			}
		}
		for _, a := range node.Applied {
			key, err := keys.AppliedKey{Node: node.Name, Module: a.Module}.Key()
			if err != nil {
				return err
			}
			if err := fn(node, keys.AppliedBucket, key, a.Applied, nil); err != nil {
				return err
			}
		}
		for _, it := range node.Items {
			key, err := keys.CollectKey{Node: node.Name, Collection: it.Collection, Contributor: it.Contributor}.Key()
			if err != nil {
				return err
			}
			if err := fn(node, keys.CollectBucket, key, it.Item, nil); err != nil {
				return err
			}
		}
		for _, mf := range node.Manifests {
			key, err := keys.ManifestKey{Node: node.Name, Provider: mf.Provider}.Key()
			if err != nil {
				return err
			}
			if err := fn(node, keys.ManifestsBucket, key, mf.Manifest, nil); err != nil {
				return err
			}
		}
		for _, r := range node.Malformed {
			if err := fn(node, r.Bucket, r.Key, nil, r.Value); err != nil {
				return err
			}
		}
	}
	return nil
}

// Write writes the mesh into live buckets directly (writeNode), `parallel`
// nodes at a time, the keys and values as its nodes' clients make them. The buckets must exist. progress, if set, is called after each
// node.
func (m *Mesh) Write(ctx context.Context, js jetstream.JetStream, parallel int, progress func(node string)) error {
	raw := map[string]jetstream.KeyValue{}
	for _, bucket := range keys.StateBuckets() {
		kv, err := js.KeyValue(ctx, bucket)
		if err != nil {
			return fmt.Errorf("bucket %s: %w (start mesh-provisioner first: it creates the buckets)", bucket, err)
		}
		raw[bucket] = kv
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	var mu sync.Mutex
	var wg sync.WaitGroup
	slots := make(chan struct{}, max(parallel, 1))
	for i := range m.Nodes {
		node := &m.Nodes[i]
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer func() { <-slots; wg.Done() }()
			if err := m.writeNode(ctx, raw, node); err != nil {
				cancel(fmt.Errorf("node %s: %w", node.Name, err))
				return
			}
			if progress != nil {
				mu.Lock()
				progress(node.Name)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	return m.writeBound(ctx, js)
}

// writeBound writes what the providers have bound, as each provider would
// in its own bucket, which it makes if it does not exist.
func (m *Mesh) writeBound(ctx context.Context, js jetstream.JetStream) error {
	kvs := map[string]jetstream.KeyValue{}
	for _, r := range m.Bound {
		kv, ok := kvs[r.Bucket]
		if !ok {
			var err error
			if kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: r.Bucket}); err != nil {
				return fmt.Errorf("provider bucket %s: %w", r.Bucket, err)
			}
			kvs[r.Bucket] = kv
		}
		if _, err := kv.Put(ctx, r.Key, r.Value); err != nil {
			return fmt.Errorf("provider bucket %s, key %s: %w", r.Bucket, r.Key, err)
		}
	}
	return nil
}

// writeNode writes one node's keys into the buckets directly, each key as
// the node's client builds it and the value as it encodes it: a fixture
// of the mesh, written with the grant of whoever writes it (the tests',
// simulate's), not through the service's write verbs.
func (m *Mesh) writeNode(ctx context.Context, raw map[string]jetstream.KeyValue, node *Node) error {
	put := func(bucket string, key string, err error, value proto.Message) error {
		if err != nil {
			return err
		}
		data, err := proto.MarshalOptions{Deterministic: true}.Marshal(value)
		if err != nil {
			return fmt.Errorf("encode %s: %w", key, err)
		}
		if _, err := raw[bucket].Put(ctx, key, data); err != nil {
			return fmt.Errorf("put %s in %s: %w", key, bucket, err)
		}
		return nil
	}
	for _, n := range node.Needs {
		key, err := keys.NeedKey{Node: node.Name, Module: n.Module, Kind: n.Kind, Name: n.Name}.Key()
		if err := put(keys.NeedsBucket, key, err, n.Need); err != nil {
			return err
		}
	}
	for _, a := range node.Applied {
		key, err := keys.AppliedKey{Node: node.Name, Module: a.Module}.Key()
		if err := put(keys.AppliedBucket, key, err, a.Applied); err != nil {
			return err
		}
	}
	for _, it := range node.Items {
		key, err := keys.CollectKey{Node: node.Name, Collection: it.Collection, Contributor: it.Contributor}.Key()
		if err := put(keys.CollectBucket, key, err, it.Item); err != nil {
			return err
		}
	}
	for _, mf := range node.Manifests {
		key, err := keys.ManifestKey{Node: node.Name, Provider: mf.Provider}.Key()
		if err := put(keys.ManifestsBucket, key, err, mf.Manifest); err != nil {
			return err
		}
	}
	for _, r := range node.Malformed {
		if _, err := raw[r.Bucket].Put(ctx, r.Key, r.Value); err != nil {
			return fmt.Errorf("malformed key %s: %w", r.Key, err)
		}
	}
	return nil
}

package service

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// held is one key of a bucket as the copy holds it: its decoded record, or,
// for a key out of the bucket's shape, the report of it.
type held[R proto.Message] struct {
	key       string
	record    R        // nil when malformed is set
	tokens    []string // of a malformed key only: filters read them
	malformed *provisionerv1.MalformedKey
}

// group holds the keys that share a first token: a node's keys, or one kind
// of the registry.
type group[R proto.Message] struct {
	byKey map[string]*held[R]
	// changedAt is the revision of the group's last change.
	changedAt uint64
	// view is the group in key order, built on the first read after a
	// change; nil while stale.
	view atomic.Pointer[view[R]]
}

// view is a group's records and malformed keys, each in key order.
type view[R proto.Message] struct {
	records   []R
	malformed []*held[R]
	// memo is what the last composition of a node resolved from these
	// records (needs' views only); a change makes a new view without one.
	memo atomic.Pointer[compose.Memo]
}

// bucketCopy is the watched copy of one bucket, grouped by the key's first
// token. Records are decoded once, as they arrive; answers share them, so
// they are never changed after that.
type bucketCopy[R proto.Message] struct {
	bucket   string
	decode   func(key string, value []byte, revision uint64) (R, error)
	loaded   chan struct{} // closed once the first watcher's initial values are in
	loadOnce sync.Once

	mu       sync.RWMutex
	groups   map[string]*group[R]
	revision uint64
	advanced chan struct{} // closed and replaced whenever revision moves
}

func newBucketCopy[R proto.Message](bucket string, decode func(string, []byte, uint64) (R, error)) *bucketCopy[R] {
	return &bucketCopy[R]{
		bucket:   bucket,
		decode:   decode,
		loaded:   make(chan struct{}),
		groups:   map[string]*group[R]{},
		advanced: make(chan struct{}),
	}
}

// watch keeps the copy up to date until ctx is done or the watcher stops. It
// may be called again after it returns: the keys a new watcher does not
// deliver among its initial values are dropped from the copy then.
func (c *bucketCopy[R]) watch(ctx context.Context, kv jetstream.KeyValue) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("watch bucket %s: %w", c.bucket, err)
	}
	defer w.Stop()
	initial := map[string]bool{}
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("watcher of bucket %s stopped", c.bucket)
			}
			if e == nil {
				c.keepOnly(initial)
				initial = nil
				c.markLoaded()
				continue
			}
			if initial != nil {
				initial[e.Key()] = true
			}
			c.apply(e.Key(), e.Value(), e.Revision(), e.Operation() != jetstream.KeyValuePut)
		}
	}
}

func (c *bucketCopy[R]) markLoaded() { c.loadOnce.Do(func() { close(c.loaded) }) }

// keepOnly drops the keys a new watcher did not deliver: they were deleted
// while no watcher ran.
func (c *bucketCopy[R]) keepOnly(live map[string]bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for first, g := range c.groups {
		for key := range g.byKey {
			if !live[key] {
				delete(g.byKey, key)
				g.view.Store(nil)
				g.changedAt = c.revision
			}
		}
		if len(g.byKey) == 0 {
			delete(c.groups, first)
		}
	}
}

// apply takes one change into the copy: a put, or a delete or purge.
func (c *bucketCopy[R]) apply(key string, value []byte, revision uint64, deleted bool) {
	first, _, _ := strings.Cut(key, ".")
	var h *held[R]
	if !deleted {
		h = &held[R]{key: key}
		record, err := c.decode(key, value, revision)
		if err != nil {
			h.tokens = strings.Split(key, ".")
			h.malformed = &provisionerv1.MalformedKey{Bucket: c.bucket, Key: key, Reason: err.Error(), Revision: revision}
		} else {
			h.record = record
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if revision > c.revision {
		c.revision = revision
		close(c.advanced)
		c.advanced = make(chan struct{})
	}
	g := c.groups[first]
	if g == nil {
		if deleted {
			return
		}
		g = &group[R]{byKey: map[string]*held[R]{}}
		c.groups[first] = g
	}
	g.changedAt = revision
	g.view.Store(nil)
	if deleted {
		delete(g.byKey, key)
		return // an empty group stays: it remembers when it changed
	}
	g.byKey[key] = h
}

func (c *bucketCopy[R]) name() string { return c.bucket }

func (c *bucketCopy[R]) ready() bool {
	select {
	case <-c.loaded:
		return true
	default:
		return false
	}
}

// at returns the revision the copy has reached.
func (c *bucketCopy[R]) at() uint64 {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return c.revision
}

// waitFor returns true once the copy has reached revision, or false when
// ctx is done first.
func (c *bucketCopy[R]) waitFor(ctx context.Context, revision uint64) bool {
	for {
		c.mu.RLock()
		reached, advanced := c.revision >= revision, c.advanced
		c.mu.RUnlock()
		if reached {
			return true
		}
		select {
		case <-advanced:
		case <-ctx.Done():
			return false
		}
	}
}

// viewOf returns a group's view, building it if it is stale. The caller
// holds c.mu for reading; concurrent readers may build it twice, harmlessly.
func (g *group[R]) viewOf() *view[R] {
	if v := g.view.Load(); v != nil {
		return v
	}
	v := &view[R]{}
	all := make([]*held[R], 0, len(g.byKey))
	for _, h := range g.byKey {
		all = append(all, h)
	}
	slices.SortFunc(all, func(a, b *held[R]) int { return cmp.Compare(a.key, b.key) })
	for _, h := range all {
		if h.malformed != nil {
			v.malformed = append(v.malformed, h)
		} else {
			v.records = append(v.records, h.record)
		}
	}
	g.view.Store(v)
	return v
}

// groupOf returns the view of the keys whose first token is first, the
// revision of the group's last change, and the copy's revision.
func (c *bucketCopy[R]) groupOf(first string) (v *view[R], changedAt, revision uint64) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	v = &view[R]{}
	if g := c.groups[first]; g != nil {
		v, changedAt = g.viewOf(), g.changedAt
	}
	return v, changedAt, c.revision
}

// get returns the record of a key whose first token is first, if the copy
// holds it and it is not malformed.
func (c *bucketCopy[R]) get(first, key string) (R, bool) {
	c.mu.RLock()
	defer c.mu.RUnlock()
	var zero R
	g := c.groups[first]
	if g == nil {
		return zero, false
	}
	h := g.byKey[key]
	if h == nil || h.malformed != nil {
		return zero, false
	}
	return h.record, true
}

// selection narrows a bucket's keys: first, if set, is the key's first token;
// keep decides for a good record, keepMalformed for a malformed key's tokens.
type selection[R proto.Message] struct {
	first         string
	keep          func(R) bool
	keepMalformed func(tokens []string) bool
}

// read returns the records and malformed keys the selection keeps, in key
// order, and the revision the copy had reached.
func (c *bucketCopy[R]) read(sel selection[R]) (records []R, malformed []*provisionerv1.MalformedKey, revision uint64) {
	if sel.first != "" {
		v, _, revision := c.groupOf(sel.first)
		for _, r := range v.records {
			if sel.keep == nil || sel.keep(r) {
				records = append(records, r)
			}
		}
		for _, h := range v.malformed {
			if sel.keepMalformed == nil || sel.keepMalformed(h.tokens) {
				malformed = append(malformed, h.malformed)
			}
		}
		return records, malformed, revision
	}

	var kept []*held[R]
	c.mu.RLock()
	revision = c.revision
	for _, g := range c.groups {
		for _, h := range g.byKey {
			if h.malformed != nil {
				if sel.keepMalformed == nil || sel.keepMalformed(h.tokens) {
					kept = append(kept, h)
				}
			} else if sel.keep == nil || sel.keep(h.record) {
				kept = append(kept, h)
			}
		}
	}
	c.mu.RUnlock()

	slices.SortFunc(kept, func(a, b *held[R]) int { return cmp.Compare(a.key, b.key) })
	for _, h := range kept {
		if h.malformed != nil {
			malformed = append(malformed, h.malformed)
		} else {
			records = append(records, h.record)
		}
	}
	return records, malformed, revision
}

// mirror is the watched copy of the four provisioning buckets.
type mirror struct {
	registry *bucketCopy[*provisionerv1.RegistryRecord]
	needs    *bucketCopy[*provisionerv1.NeedRecord]
	applied  *bucketCopy[*provisionerv1.AppliedRecord]
	collect  *bucketCopy[*provisionerv1.CollectRecord]
}

func newMirror() *mirror {
	return &mirror{
		registry: newBucketCopy(keys.RegistryBucket, decodeRegistry),
		needs:    newBucketCopy(keys.NeedsBucket, decodeNeed),
		applied:  newBucketCopy(keys.AppliedBucket, decodeApplied),
		collect:  newBucketCopy(keys.CollectBucket, decodeCollect),
	}
}

// watched is what the mirror needs of each bucket copy, whatever its record.
type watched interface {
	name() string
	ready() bool
	watch(ctx context.Context, kv jetstream.KeyValue) error
	at() uint64
	waitFor(ctx context.Context, revision uint64) bool
}

// copyOf returns the copy of the bucket a what reads.
func (m *mirror) copyOf(what provisionerv1.What) watched {
	switch what {
	case provisionerv1.What_WHAT_NEEDS:
		return m.needs
	case provisionerv1.What_WHAT_APPLIED:
		return m.applied
	case provisionerv1.What_WHAT_COLLECT:
		return m.collect
	}
	return m.registry
}

// registryEntry returns the entry that answers kind, or nil.
func (m *mirror) registryEntry(kind string) *provisionerv1.RegistryEntry {
	r, ok := m.registry.get(kind, kind)
	if !ok {
		return nil
	}
	return r.GetEntry()
}

func (m *mirror) buckets() []watched {
	return []watched{m.registry, m.needs, m.applied, m.collect}
}

// loading returns the buckets whose initial values are not in yet.
func (m *mirror) loading() []string {
	var buckets []string
	for _, c := range m.buckets() {
		if !c.ready() {
			buckets = append(buckets, c.name())
		}
	}
	return buckets
}

// decodeValue unmarshals a bucket value into msg, saying which type failed.
// The sentence leaves out the protobuf library's own, whose wording varies
// from build to build by design: answers that report it stay the same.
func decodeValue(value []byte, msg proto.Message) error {
	if err := proto.Unmarshal(value, msg); err != nil {
		return fmt.Errorf("value of %d bytes does not decode as %s", len(value), msg.ProtoReflect().Descriptor().FullName())
	}
	return nil
}

func decodeRegistry(key string, value []byte, revision uint64) (*provisionerv1.RegistryRecord, error) {
	kind, err := keys.ParseRegistryKey(key)
	if err != nil {
		return nil, err
	}
	entry := &provisionerv1.RegistryEntry{}
	if err := decodeValue(value, entry); err != nil {
		return nil, err
	}
	if entry.GetKind() != kind {
		return nil, fmt.Errorf("key %q holds the entry of kind %q", key, entry.GetKind())
	}
	return &provisionerv1.RegistryRecord{Kind: kind, Entry: entry, Revision: revision}, nil
}

func decodeNeed(key string, value []byte, revision uint64) (*provisionerv1.NeedRecord, error) {
	k, err := keys.ParseNeedKey(key)
	if err != nil {
		return nil, err
	}
	need := &provisionerv1.Need{}
	if err := decodeValue(value, need); err != nil {
		return nil, err
	}
	return &provisionerv1.NeedRecord{Node: k.Node, Module: k.Module, Kind: k.Kind, Name: k.Name, Need: need, Revision: revision}, nil
}

func decodeApplied(key string, value []byte, revision uint64) (*provisionerv1.AppliedRecord, error) {
	k, err := keys.ParseAppliedKey(key)
	if err != nil {
		return nil, err
	}
	applied := &provisionerv1.Applied{}
	if err := decodeValue(value, applied); err != nil {
		return nil, err
	}
	return &provisionerv1.AppliedRecord{Node: k.Node, Module: k.Module, Applied: applied, Revision: revision}, nil
}

func decodeCollect(key string, value []byte, revision uint64) (*provisionerv1.CollectRecord, error) {
	k, err := keys.ParseCollectKey(key)
	if err != nil {
		return nil, err
	}
	item := &provisionerv1.CollectItem{}
	if err := decodeValue(value, item); err != nil {
		return nil, err
	}
	return &provisionerv1.CollectRecord{Node: k.Node, Collection: k.Collection, Contributor: k.Contributor, Item: item, Revision: revision}, nil
}

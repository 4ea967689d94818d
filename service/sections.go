package service

import (
	"sync"
	"time"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
)

// A node that writes a need asks for its composition at once, and nearly
// all of it is what it was: every module but the one whose need changed.
// The compose verb keeps each node's last whole composition in sections,
// one for each run of its needs of one module (in key order), each encoded
// in binary and read for the digest once (compose.DigestPart). While what
// a composition reads beyond the node's needs is unchanged (sectionStamp),
// a whole-node binary request composes again only the sections whose needs
// changed, and its answer is the sections' encodings one after the other:
// protobuf reads concatenated encodings as one message, with each repeated
// field's elements in order. make bench-verb measures the gain ("compose
// right after a write, binary").

// section is one run of a node's needs of one module, composed.
type section struct {
	// needs are the run's entries, whose identity says that the run is
	// unchanged: a copy's view reuses the entry of a value it still holds.
	needs   []*mirror.Entry[*provisionerv1.NeedRecord]
	encoded []byte // its plans, provisions and refusals, in binary
	digest  compose.DigestPart
	// buckets are the providers' buckets of its provisions, for behind.
	buckets []string
}

func (s *section) size() int {
	return len(s.encoded) + s.digest.Size() + 8*len(s.needs) + 16*len(s.buckets) + 128
}

// sectionStamp identifies what a node's composition reads beyond its
// needs: equal stamps, and a section's needs the same entries, mean the
// section composes alike.
type sectionStamp struct {
	registry, applied, collect, manifests, bound uint64
}

// sectionStampOf reads the stamp of what node's composition reads beyond
// its needs, before it reads any: a change after it makes the stamp of the
// sections it composes older than the next request's.
func sectionStampOf(m *mirror.Mirror, node string) sectionStamp {
	registry, _ := m.Registry.Stamp("")
	applied, _ := m.Applied.Stamp(node)
	collect, _ := m.Collect.Stamp(node)
	manifests, _ := m.Manifests.Stamp("")
	return sectionStamp{registry: registry, applied: applied, collect: collect, manifests: manifests, bound: m.Bound.Stamp()}
}

// nodeSections is a node's last whole composition, in sections in key
// order.
type nodeSections struct {
	stamp    sectionStamp
	sections []*section
	bytes    int
}

// sectionCache keeps nodes' sections within a byte budget. Over it, it
// drops whichever nodes' sections the map yields first: they are a
// shortcut, composed again at the next request, and the nodes that write
// and ask again at once are the ones put back at once.
type sectionCache struct {
	limit int

	mu     sync.Mutex
	byNode map[string]*nodeSections
	bytes  int
}

func newSectionCache(limit int) *sectionCache {
	return &sectionCache{limit: limit, byNode: map[string]*nodeSections{}}
}

// get returns the sections of node composed at st, or nil.
func (c *sectionCache) get(node string, st sectionStamp) *nodeSections {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns := c.byNode[node]; ns != nil && ns.stamp == st {
		return ns
	}
	return nil
}

// put keeps node's sections in place of those it had, making room.
func (c *sectionCache) put(node string, ns *nodeSections) {
	if ns.bytes > c.limit/8 {
		return // one node must not push out most of the others
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if old := c.byNode[node]; old != nil {
		c.bytes -= old.bytes
	}
	c.byNode[node] = ns
	c.bytes += ns.bytes
	for other, o := range c.byNode {
		if c.bytes <= c.limit {
			break
		}
		if other != node {
			delete(c.byNode, other)
			c.bytes -= o.bytes
		}
	}
}

// composeSections answers a request for a whole node (no module, no page)
// in binary from the node's sections, composing again those whose needs
// changed; ok is false when it cannot: the request asks for a module, a
// page or JSON, or the answer would not fit budget (the request is then
// answered in pages by composeFrom, which the result equals).
func (s *Service) composeSections(in *provisionerv1.ComposeRequest, enc encoding, budget int) (data []byte, t timings, ok bool) {
	if s.sections == nil || enc.json || in.GetModule() != "" || in.GetPageToken() != "" || in.GetPageSize() != 0 {
		return nil, timings{}, false
	}
	m := s.mirror
	start := time.Now()
	node := in.GetNode()
	st := sectionStampOf(m, node)
	entries, _, _ := m.Needs.Group(node)
	read := time.Since(start)

	var old []*section
	if kept := s.sections.get(node, st); kept != nil {
		old = kept.sections
	}
	var composer *compose.Composer
	var done func()
	defer func() {
		if done != nil {
			done()
		}
	}()
	ns := &nodeSections{stamp: st}
	for len(entries) > 0 {
		module := moduleOf(entries[0])
		n := 1
		for n < len(entries) && moduleOf(entries[n]) == module {
			n++
		}
		run := entries[:n:n]
		entries = entries[n:]
		// Both lists are in key order: the old section of this run, if
		// any, is the first not before it.
		for len(old) > 0 && old[0].needs[0].Key < run[0].Key {
			old = old[1:]
		}
		if len(old) > 0 && sameEntries(old[0].needs, run) {
			ns.sections = append(ns.sections, old[0])
			ns.bytes += old[0].size()
			continue
		}
		if composer == nil {
			var arena *compose.Arena
			arena, done = pooledArena()
			composer = s.sectionComposer(node, arena)
		}
		sec, err := composeSection(composer, run)
		if err != nil {
			return nil, timings{}, false // composeFrom answers, and reports it
		}
		ns.sections = append(ns.sections, sec)
		ns.bytes += sec.size()
	}
	s.sections.put(node, ns)

	size := 0
	parts := make([]compose.DigestPart, len(ns.sections))
	var buckets []string
	for i, sec := range ns.sections {
		size += len(sec.encoded)
		parts[i] = sec.digest
		buckets = append(buckets, sec.buckets...)
	}
	head := &provisionerv1.ComposeResponse{Node: node, PlanDigest: compose.DigestOf(node, "", parts...),
		Behind: append(m.Behind(), boundBucketsBehind(m, buckets)...)}
	data, err := deterministic.MarshalAppend(make([]byte, 0, deterministic.Size(head)+size), head)
	if err != nil || len(data)+size > budget {
		return nil, timings{}, false
	}
	for _, sec := range ns.sections {
		data = append(data, sec.encoded...)
	}
	return data, timings{read: read, resolve: time.Since(start) - read}, true
}

// sectionComposer returns a Composer of node from the copy, in arena.
func (s *Service) sectionComposer(node string, arena *compose.Arena) *compose.Composer {
	m := s.mirror
	items, _, _ := m.Collect.Group(node)
	applied, _, _ := m.Applied.Group(node)
	if applied == nil {
		applied = []*mirror.Entry[*provisionerv1.AppliedRecord]{} // read: none
	}
	records := make([]*provisionerv1.CollectRecord, 0, len(items))
	for _, e := range items {
		if e.Malformed == nil {
			records = append(records, e.Record)
		}
	}
	return compose.NewComposer(compose.Input{Node: node, Sources: sourcesOf(m, applied), Items: records, Arena: arena})
}

// composeSection composes a run of needs of one module into a section.
func composeSection(composer *compose.Composer, run []*mirror.Entry[*provisionerv1.NeedRecord]) (*section, error) {
	var needs []*provisionerv1.NeedRecord
	var malformed []*provisionerv1.MalformedKey
	for _, e := range run {
		if e.Malformed != nil {
			malformed = append(malformed, e.Malformed)
		} else {
			needs = append(needs, e.Record)
		}
	}
	part := composer.Part(needs, malformed)
	part = &provisionerv1.ComposeResponse{Plans: part.GetPlans(), Provisions: part.GetProvisions(), Refusals: part.GetRefusals()}
	encoded, err := marshalCompose(part)
	if err != nil {
		return nil, err
	}
	sec := &section{needs: run, encoded: encoded, digest: compose.DigestPartOf(part)}
	for _, p := range part.GetProvisions() {
		if n := len(sec.buckets); n == 0 || sec.buckets[n-1] != p.GetBucket() {
			sec.buckets = append(sec.buckets, p.GetBucket())
		}
	}
	return sec, nil
}

// sameEntries reports whether two runs are the same entries.
func sameEntries(a, b []*mirror.Entry[*provisionerv1.NeedRecord]) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

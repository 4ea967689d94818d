package answers

import (
	"bytes"
	"strconv"
	"sync"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
)

// A node that writes a need asks for its composition at once, and nearly
// all of it is what it was: every module but the one whose need changed.
// The compose verb keeps each node's last whole composition in sections,
// one for each run of its needs of one module (in key order), each encoded
// (in the encoding asked: binary and JSON are kept apart) and read for the
// digest once (compose.DigestPart). While what a composition reads beyond
// the node's needs is unchanged (sectionStamp), a whole-node request
// composes again only the sections whose needs changed, and its answer is
// made of the sections' encodings: in binary one after the other, which
// protobuf reads as one message with each repeated field's elements in
// order; in JSON each list's elements, section after section. make
// bench-verb measures the gain ("compose right after a write").

// section is one run of a node's needs of one module, composed.
type section struct {
	// needs are the run's entries, whose identity says that the run is
	// unchanged: a copy's view reuses the entry of a value it still holds.
	needs []*mirror.Entry[*provisionerv1.NeedRecord]
	// encoded is its plans, provisions and refusals in binary; in JSON,
	// each list's elements, comma-separated (sectionLists).
	encoded [len(sectionLists)][]byte
	digest  compose.DigestPart
	// buckets are the providers' buckets of its provisions, for behind.
	buckets []string
}

func (s *section) size() int {
	return len(s.encoded[0]) + len(s.encoded[1]) + len(s.encoded[2]) + s.digest.Size() + neededEntry*len(s.needs) + 16*len(s.buckets) + 128
}

// neededEntry is what a section counts for each of its needs: the decoded
// entry, which it keeps alive once the node's view is dropped.
const neededEntry = 256

// sectionLists are the lists of a composition a section holds, in the
// order of their fields.
var sectionLists = [...]protoreflect.Name{"plans", "provisions", "refusals"}

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
	return sectionStamp{registry: registry, applied: applied, collect: collect, manifests: manifests, bound: m.Bound.StampOf(node)}
}

// nodeSections is a node's last whole composition, in sections in key
// order; none while the node was asked only once (askedOnce), or when
// whole says that its composition is too large to keep or to answer at
// once (it is then composed whole, and paged, until the stamp changes).
type nodeSections struct {
	stamp    sectionStamp
	sections []*section
	whole    bool
	bytes    int
}

// askedOnce is what the note of a node asked once costs.
const askedOnce = 128

// sectionCache keeps nodes' sections within a byte budget. Over it, it
// drops whichever nodes' sections the map yields first: they are a
// shortcut, composed again at the next request, and the nodes that write
// and ask again at once are the ones put back at once.
type sectionCache struct {
	limit int

	mu     sync.Mutex
	byNode map[sectionsKey]*nodeSections
	bytes  int
}

// sectionsKey is a node's in an encoding.
type sectionsKey struct {
	node string
	json bool
}

func newSectionCache(limit int) *sectionCache {
	return &sectionCache{limit: limit, byNode: map[sectionsKey]*nodeSections{}}
}

// get returns the sections of a node composed at st, or nil.
func (c *sectionCache) get(node sectionsKey, st sectionStamp) *nodeSections {
	c.mu.Lock()
	defer c.mu.Unlock()
	if ns := c.byNode[node]; ns != nil && ns.stamp == st {
		return ns
	}
	return nil
}

// keeps reports whether put keeps ns: one node's sections must not push
// out most of the others'.
func (c *sectionCache) keeps(ns *nodeSections) bool { return ns.bytes <= c.limit/8 }

// put keeps a node's sections in place of those it had, making room.
func (c *sectionCache) put(node sectionsKey, ns *nodeSections) {
	if !c.keeps(ns) {
		return
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
// from the node's sections, composing again those whose needs changed; ok
// is false when it cannot: the request asks for a module or a page, or the
// answer would not fit budget (the request is then answered in pages by
// composeFrom, whose answer the result equals but for the order of its
// fields).
func (s *Answers) composeSections(in *provisionerv1.ComposeRequest, enc Encoding, budget Budget) (data []byte, t Timings, ok bool) {
	if s.sections == nil || in.GetModule() != "" || in.GetPageToken() != "" || in.GetPageSize() != 0 {
		return nil, Timings{}, false
	}
	m := s.mirror
	start := time.Now()
	node := in.GetNode()
	st := sectionStampOf(m, node)
	entries, _, _ := m.Needs.Group(node)
	read := time.Since(start)

	key := sectionsKey{node: node, json: enc.json}
	kept := s.sections.get(key, st)
	if kept == nil {
		// Sections cost more than a composition made whole the first
		// time (x1.15-1.5, BenchmarkComposeNode/encoded), and pay from
		// the next: a node asked for the first time since what its
		// composition reads changed is composed whole, and noted, so that
		// its next request (after its needs changed: an unchanged one is
		// answered from the answer cache) makes them.
		s.sections.put(key, &nodeSections{stamp: st, bytes: askedOnce})
		return nil, Timings{}, false
	}
	if kept.whole {
		return nil, Timings{}, false
	}
	old := kept.sections
	var composer *compose.Composer
	var shared sharedParts
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
		sec, err := composeSection(composer, &shared, run, enc)
		if err != nil {
			return nil, Timings{}, false // composeFrom answers, and reports it
		}
		ns.sections = append(ns.sections, sec)
		ns.bytes += sec.size()
	}
	parts := make([]compose.DigestPart, len(ns.sections))
	var buckets []string
	for i, sec := range ns.sections {
		parts[i] = sec.digest
		buckets = append(buckets, sec.buckets...)
	}
	head := &provisionerv1.ComposeResponse{Node: node, PlanDigest: compose.DigestOf(node, "", parts...),
		Behind: append(m.Behind(), boundBucketsBehind(m, buckets)...)}
	data, err := ns.join(head, enc)
	fits := err == nil && len(data) <= budget.Fill
	if fits && s.sections.keeps(ns) {
		s.sections.put(key, ns)
	} else {
		s.sections.put(key, &nodeSections{stamp: st, whole: true, bytes: askedOnce})
	}
	if !fits {
		return nil, Timings{}, false
	}
	return data, Timings{read: read, resolve: time.Since(start) - read}, true
}

// join returns the answer made of head and the sections.
func (ns *nodeSections) join(head *provisionerv1.ComposeResponse, enc Encoding) ([]byte, error) {
	size := 0
	for _, sec := range ns.sections {
		for _, list := range sec.encoded {
			size += len(list) + 1
		}
	}
	if !enc.json {
		size += deterministic.Size(head)
		data, err := deterministic.MarshalAppend(make([]byte, 0, size+joinRoom(size)), head)
		for _, sec := range ns.sections {
			data = append(data, sec.encoded[0]...)
		}
		return data, err
	}
	// As marshalJSON writes an answer: its lists last, each element's JSON
	// as it is found.
	js, err := protojson.Marshal(head)
	if err != nil {
		return nil, err
	}
	js = bytes.TrimSpace(js)
	data := append(make([]byte, 0, len(js)+size+64), js[:len(js)-1]...) // without its closing brace
	for i, name := range sectionLists {
		open := false
		for _, sec := range ns.sections {
			if len(sec.encoded[i]) == 0 {
				continue
			}
			data = append(data, ',')
			if !open {
				data = strconv.AppendQuote(data, headFields.ByName(name).JSONName())
				data = append(data, ':', '[')
				open = true
			}
			data = append(data, sec.encoded[i]...)
		}
		if open {
			data = append(data, ']')
		}
	}
	return append(data, '}'), nil
}

// headFields are a composition's fields.
var headFields = (&provisionerv1.ComposeResponse{}).ProtoReflect().Descriptor().Fields()

// sectionComposer returns a Composer of node from the copy, in arena.
func (s *Answers) sectionComposer(node string, arena *compose.Arena) *compose.Composer {
	m := s.mirror
	items, _, _ := m.Collect.Group(node)
	builds, _ := m.BuildsOf(node)
	records := make([]*provisionerv1.CollectRecord, 0, len(items))
	for _, e := range items {
		if e.Malformed == nil {
			records = append(records, e.Record)
		}
	}
	return compose.NewComposer(compose.Input{Node: node, Sources: m.Sources(&builds), Items: records, Arena: arena})
}

// sharedParts is what the sections of one composition share as they are
// encoded and digested: each list of collected items encoded once, each
// collection's items hashed once.
type sharedParts struct {
	lists    *collectedLists
	digester compose.PartDigester
}

// composeSection composes a run of needs of one module into a section,
// encoded in enc.
func composeSection(composer *compose.Composer, shared *sharedParts, run []*mirror.Entry[*provisionerv1.NeedRecord], enc Encoding) (*section, error) {
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
	if shared.lists == nil {
		shared.lists = newCollectedLists()
		if enc.json {
			shared.lists = &collectedLists{marshal: deterministic} // as planKey must
		}
	}
	sec := &section{needs: run, digest: shared.digester.Part(part)}
	var err error
	if !enc.json {
		sec.encoded[0], err = shared.lists.marshalCompose(part)
	} else {
		sec.encoded, err = sectionJSON(part, shared.lists)
	}
	if err != nil {
		return nil, err
	}
	for _, p := range part.GetProvisions() {
		if n := len(sec.buckets); n == 0 || sec.buckets[n-1] != p.GetBucket() {
			sec.buckets = append(sec.buckets, p.GetBucket())
		}
	}
	return sec, nil
}

// sectionJSON returns each list of a section's composition in JSON: its
// elements, comma-separated, each as marshalJSON finds it.
func sectionJSON(part *provisionerv1.ComposeResponse, collected *collectedLists) (lists [len(sectionLists)][]byte, err error) {
	m := part.ProtoReflect()
	for i, name := range sectionLists {
		list := m.Get(headFields.ByName(name)).List()
		for j := range list.Len() {
			element, err := jsonElements.get(list.Get(j).Message().Interface(), collected)
			if err != nil {
				return lists, err
			}
			if j > 0 {
				lists[i] = append(lists[i], ',')
			}
			lists[i] = append(lists[i], element...)
		}
	}
	return lists, nil
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

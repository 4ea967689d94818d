package plans

import (
	"encoding/binary"
	"slices"
	"strings"

	"github.com/zeebo/xxh3"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
)

// Kept is what the plans writer keeps of a node's last composition, module
// by module in key order: a mark of each module's needs (their keys'
// revisions) and builds, and the sum of its group in the plan digest
// (compose.ModuleSum), so that a change of some modules' needs or builds,
// or of a registry entry or a manifest they name (Forgetting), composes
// those modules again and no other (ComposeChanged). Some 50
// bytes a module, its name cloned.
type Kept struct {
	modules []keptModule
	// collections are the sums of the node's collections its modules
	// read: the node's items, whose change composes it whole, are read
	// only for a collection met anew.
	collections compose.CollectionCache
	// kinds and providers are the registry entries and manifests changed
	// since it was made (Forgetting), each sorted: their modules are found
	// and composed again by the next ComposeChanged.
	kinds, providers []string
}

type keptModule struct {
	module string
	mark   uint64
	sum    [16]byte
	// grouped says the module made a group: a module whose every need is
	// of a build out of the plan makes none, and has no sum.
	grouped bool
	// stale says the module is to be composed again whatever its mark
	// (Forgetting).
	stale bool
}

// Forgetting returns k with the modules whose needs are of one of kinds,
// or name one of providers, to be composed again whatever their marks: a
// registry entry of those kinds, or a manifest of those providers,
// changed. It only records them, so that a writer told of a change that
// many nodes read pays for it on the cores that compose them: the next
// ComposeChanged finds the modules (marksOf, stale). A need is resolved
// by its own kind's entry and its own provider's manifest, so the node's
// other modules keep their sums. The sums of the node's collections are
// kept: an entry's template names the collection a need reads, but a
// collection's sum is of the node's items alone (a change of them
// composes the node without a Kept), so a template naming another
// collection finds its sum missing, not wrong. k is not changed.
func (k *Kept) Forgetting(kinds, providers []string) *Kept {
	if k == nil {
		return nil
	}
	next := *k
	next.kinds, next.providers = union(k.kinds, kinds), union(k.providers, providers)
	return &next
}

// stale returns k with the modules of node that name a provider Forgetting
// recorded marked to be composed again, and nothing left to find: the
// providers are read from the copy's records, decoded only for a
// manifest's change. The modules of the kinds recorded are found by
// marksOf, from the needs' keys, as it reads them for their marks. k is
// not changed.
func (k *Kept) stale(m *mirror.Mirror, node string) *Kept {
	if k == nil || len(k.kinds)+len(k.providers) == 0 {
		return k
	}
	next := &Kept{modules: k.modules, collections: k.collections}
	if len(k.providers) == 0 {
		return next
	}
	stale := map[string]bool{}
	entries, _, _ := m.Needs.Group(node)
	for _, e := range entries {
		if e.Record == nil {
			continue
		}
		if _, ok := slices.BinarySearch(k.providers, e.Record.GetNeed().GetProvider()); ok {
			stale[e.Record.GetModule()] = true
		}
	}
	next.modules = slices.Clone(k.modules)
	for i := range next.modules {
		if stale[next.modules[i].module] {
			next.modules[i].stale = true
		}
	}
	return next
}

// moduleMark is a module's mark as the copy holds it now: its name is a
// window on the copy's key, to be cloned before it is kept.
type moduleMark struct {
	module string
	mark   uint64
	// ofKinds says one of its needs is of a kind marksOf was given: a
	// registry entry it reads changed.
	ofKinds bool
}

// appliedRevision is the revision of a module's applied record.
type appliedRevision struct {
	module   string
	revision uint64
}

// marksOf returns the marks of node's modules, in key order, appended to
// marks: of each module, its needs' count, newest and summed revisions (a
// put moves the newest, a delete the count) and its applied record's
// revision (its builds), and how many needs it holds well formed; and
// whether any of its needs is of one of kinds, sorted. It decodes no value,
// and parses one key a module (mirror.Copy.Spans).
func marksOf(m *mirror.Mirror, node string, scratch *digestScratch, kinds []string) (marks []moduleMark, held int) {
	applied := scratch.applied[:0]
	m.Applied.KeyRevisions(node, func(key string, revision uint64) {
		applied = append(applied, appliedRevision{module: key[len(node)+1:], revision: revision})
	})
	scratch.applied = applied
	marks = scratch.marks[:0]
	m.Needs.Spans(node, kinds, func(s mirror.Span) {
		var builds uint64
		if i, ok := slices.BinarySearchFunc(applied, s.Second, func(a appliedRevision, m string) int { return strings.Compare(a.module, m) }); ok {
			builds = applied[i].revision
		}
		var b [32]byte
		binary.LittleEndian.PutUint64(b[0:], uint64(s.Keys))
		binary.LittleEndian.PutUint64(b[8:], s.Newest)
		binary.LittleEndian.PutUint64(b[16:], s.Total)
		binary.LittleEndian.PutUint64(b[24:], builds)
		marks = append(marks, moduleMark{module: s.Second, mark: xxh3.Hash(b[:]), ofKinds: s.OfThirds})
		held += s.Keys
	})
	scratch.marks = marks
	return marks, held
}

// ComposeChanged returns node's Plan as Compose does, composing again only
// the modules whose needs or applied records changed since kept was made
// (all of them when kept is nil), and what to keep for the next. With a
// kept, the Plan's Buckets, Kinds, Providers and Revisions are those of
// the modules composed alone: the caller adds them to what it knew of the
// node. Its Records counts the node's needs and the items read, whichever
// were composed: the node's size, which the writer's Share is of. Any
// other change a node's composition reads (its items, its providers' keys,
// the registry, the manifests) is for ComposeChanged with a nil kept.
func ComposeChanged(m *mirror.Mirror, node string, kept *Kept) (Plan, *Kept) {
	var kinds []string
	if kept != nil {
		kinds = kept.kinds
	}
	kept = kept.stale(m, node)
	scratch := scratches.Get().(*digestScratch)
	defer scratches.Put(scratch)
	var r reads
	marks, held := marksOf(m, node, scratch, kinds)
	changed := changedModules(marks, kept)
	next := &Kept{modules: make([]keptModule, 0, len(marks))}
	if kept != nil {
		next.collections = kept.collections
	}
	items := 0
	loadItems := func() []*provisionerv1.CollectRecord {
		entries, _, _ := m.Collect.GroupInto(node, &scratch.collect)
		items = len(entries)
		scratch.items = mirror.WellFormed(scratch.items[:0], entries)
		return scratch.items
	}
	if kept == nil || 4*count(changed) > 3*len(changed) {
		// More than three quarters of the modules changed: the node's
		// needs decoded and walked whole. With every module changed, the
		// changed modules' walk (finding each module's needs apart, and
		// its builds) was 5% slower than the whole node's
		// (BenchmarkRegistryEntryChanged); with two in five, 0.6 times the
		// whole's (BenchmarkMidNodeChanged).
		entries, _, _ := m.Needs.GroupInto(node, &scratch.needs)
		builds, _ := m.BuildsOf(node)
		in := compose.Input{Node: node, Sources: r.hear(m.Sources(&builds))}
		in.Needs, _ = mirror.SplitNeeds(scratch.records[:0], nil, entries)
		sums, ok := scratch.digester.SumsOf(in, &next.collections, loadItems)
		scratch.records = emptied(in.Needs)
		if !ok {
			return composeWhole(m, node), nil // not in key order, which the copy's keys are
		}
		for _, mk := range marks {
			km := keptModule{module: strings.Clone(mk.module), mark: mk.mark}
			if len(sums) > 0 && sums[0].Module == mk.module {
				km.sum, km.grouped, sums = sums[0].Sum, true, sums[1:]
			}
			next.modules = append(next.modules, km)
		}
		if len(sums) > 0 {
			return composeWhole(m, node), nil // a group of no module marked: never so
		}
	} else {
		// The changed modules' needs walked at once, each module's builds
		// read in place as the walk asks (Sources(nil)): of a few modules,
		// rather than all of the node's (BuildsOf).
		prefixes := make([]string, 0, len(marks))
		for i, mk := range marks {
			if changed[i] {
				prefixes = append(prefixes, node+"."+mk.module+".")
			}
		}
		in := compose.Input{Node: node, Sources: r.hear(m.Sources(nil))}
		in.Needs, _ = mirror.SplitNeeds(scratch.records[:0], nil, m.Needs.RangesInto(node, prefixes, &scratch.needs))
		sums, ok := scratch.digester.SumsOf(in, &next.collections, loadItems)
		scratch.records = emptied(in.Needs)
		if !ok {
			return composeWhole(m, node), nil // not in key order, which the copy's keys are
		}
		old := keptModules(kept)
		for i, mk := range marks {
			for len(old) > 0 && compose.ModuleOrder(old[0].module, mk.module) < 0 {
				old = old[1:]
			}
			if !changed[i] {
				next.modules = append(next.modules, old[0]) // kept holds it as it is
				continue
			}
			km := keptModule{module: mk.module, mark: mk.mark}
			if len(old) > 0 && old[0].module == mk.module {
				km.module = old[0].module // a clone of its own already
			} else {
				km.module = strings.Clone(mk.module)
			}
			if len(sums) > 0 && sums[0].Module == mk.module {
				km.sum, km.grouped, sums = sums[0].Sum, true, sums[1:]
			}
			next.modules = append(next.modules, km)
		}
		if len(sums) > 0 {
			return composeWhole(m, node), nil // a group of no module changed: never so
		}
	}
	scratch.items = emptied(scratch.items)
	// The marks and revisions hold windows on the copy's strings: not
	// kept in the pool.
	scratch.marks, scratch.applied = emptied(scratch.marks), emptied(scratch.applied)
	sums := make([]compose.ModuleSum, 0, len(next.modules))
	for _, km := range next.modules {
		if km.grouped {
			sums = append(sums, compose.ModuleSum{Module: km.module, Sum: km.sum})
		}
	}
	var malformed []*provisionerv1.MalformedKey
	for _, e := range m.Needs.Odd(node) {
		malformed = append(malformed, e.Malformed)
	}
	digest := compose.DigestOfSums(node, "", sums, malformed)
	buckets := r.buckets.sorted()
	// Read after composing: a node that asks at these revisions is
	// answered a composition at least as new as the digest.
	return Plan{Digest: digest, Revisions: m.RevisionsNow().Only(buckets).Proto(), Records: held + items,
		Buckets: buckets, Kinds: r.kinds.sorted(), Providers: r.providers.sorted()}, next
}

// changedModules reports, for each of marks, whether kept lacks its module
// or holds another mark of it: all of them when kept is nil.
func changedModules(marks []moduleMark, kept *Kept) []bool {
	changed := make([]bool, len(marks))
	old := keptModules(kept)
	for i, mk := range marks {
		for len(old) > 0 && compose.ModuleOrder(old[0].module, mk.module) < 0 {
			old = old[1:]
		}
		changed[i] = kept == nil || mk.ofKinds || len(old) == 0 || old[0].module != mk.module || old[0].mark != mk.mark || old[0].stale
	}
	return changed
}

func keptModules(k *Kept) []keptModule {
	if k == nil {
		return nil
	}
	return k.modules
}

// Modules returns how many modules k holds: what the writer keeps.
func (k *Kept) Modules() int { return len(keptModules(k)) }

// count counts the true of bs.
func count(bs []bool) int {
	n := 0
	for _, b := range bs {
		if b {
			n++
		}
	}
	return n
}

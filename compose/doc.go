// Package compose resolves a node's needs against the registry: for each
// module a plan (who answers each need and where its value is), what
// providers must provision for bound needs, the needs that cannot be
// resolved and why, and the items of every collection a need reads.
//
// [Compose] is a pure function of its [Input]: the registry entries and the
// node's records, however they were read. The service feeds it from its
// watched copy; a benchmark feeds it from reads by key, to compare. A
// caller that encodes each composition and then drops it makes them in an
// [Arena] it resets and reuses, as the service does. [Digest] says what a
// composition asks the node to apply, so that a node learns its plan
// changed; a [PlanDigester] digests a composition without making it, for
// a caller that keeps only the digest. A [Composer] composes a node a part
// at a time, and [DigestOf] digests a composition from its parts'
// [DigestPart]s, which a [PartDigester] reads: the service keeps a node's
// last composition a module at a time, and composes again only the modules
// whose needs changed.
//
// These are one composition: Compose, Composer.Part and PlanDigester.Digest
// each walk the needs the same way, resolving each once, and differ only in
// what they make of it (messages, or a digest). The service's answers, its
// plans writer and the benchmarks' by-key check all reach it so.
package compose

// Package compose resolves a node's needs against the registry: for each
// module a plan (who answers each need and where its value is), what
// providers must provision for bound needs, the needs that cannot be
// resolved and why, and the items of every collection a need reads.
//
// [Compose] is a pure function of its [Input]: the registry entries and the
// node's records, however they were read. The service feeds it from its
// watched copy; a benchmark feeds it from reads by key, to compare.
package compose

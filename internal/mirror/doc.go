// Package mirror keeps the service's watched copy of the five provisioning
// buckets: every key decoded once as it arrives, grouped by its first token
// (a node, or a kind of the registry), readable in key order without a read
// by key from NATS, and of each node no more than its [Budget] allows. Of the
// providers' buckets it keeps the keys and their revisions, never their
// values ([Bound]), each followed once a composition names it.
//
// A [Copy] is one bucket's copy; a [Mirror] holds the five and the
// providers' and watches them through JetStream ([Mirror.Open],
// [Watchers.Run]); [Watchers.ReadNode] reads one node's keys alone, for an
// answer while the copy loads. [CheckRecord] and [CheckKey] check a write
// as the copy would read it, for the write verbs. [Capture] reads the
// buckets once, and [Load] makes a copy from a capture, for tests,
// benchmarks and looking into a captured mesh.
package mirror

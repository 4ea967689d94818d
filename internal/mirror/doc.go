// Package mirror keeps the service's watched copy of the four provisioning
// buckets: every key decoded once as it arrives, grouped by its first token
// (a node, or a kind of the registry), readable in key order without a read
// by key from NATS.
//
// A [Copy] is one bucket's copy; a [Mirror] holds the five and watches them
// through JetStream ([Mirror.Open], [Watchers.Run]). [Capture] reads the
// buckets once, and [Load] makes a copy from a capture, for tests,
// benchmarks and looking into a captured mesh.
package mirror

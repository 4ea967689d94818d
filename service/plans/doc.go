// Package plans is the plans room of the service: the writer that keeps
// mesh-provisioner_plans, one key a node holding the digest of the node's
// composition and the revisions it was composed at, so that a node learns
// its plan changed by watching one key.
//
// [Run] is the writer, which the seat's holder runs in its tenure: it
// composes again only the nodes whose records, providers' keys, registry
// or manifests changed, a node of many records no more often than its
// share of a core allows, and writes a digest only when it differs from
// the one the bucket holds (a compare-and-set on the key's revision).
// [Compose] is its composition of one node: the digest the node's compose
// answer carries, read from the copy (mirror.Mirror.Sources) and digested
// by compose.PlanDigester without making the composition. The writer
// composes with [ComposeChanged], which keeps each module's sum ([Kept])
// so that a change of some modules' needs composes those modules alone.
package plans

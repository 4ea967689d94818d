// Package answers is the answers room of the service: the read verbs
// (mesh-provisioner.provisioning, .compose and .provisions) answered from
// the watched copy of the buckets, one [Verb] each, which the service wraps
// in its endpoints.
//
// Every answer comes from the copy (package internal/mirror), never from a
// read by key, in key order, and names the revisions the copy had reached
// ([Verb.Lookup], [Verb.Respond]); a request that asks for later revisions
// waits for them first ([Answers.WaitRevisions]). An answer is one page: it
// never exceeds the NATS server's max_payload, whatever the request's
// page_size, and next_page_token continues it (docs/protocol.md). Requests
// are protobuf binary by default, or protobuf JSON ([EncodingOf]); the
// answer uses the request's encoding. Encoded answers are kept for reuse
// while what they read is unchanged (the answer cache, by [CacheKey] and
// [Stamp]), and a node's composition a module at a time, so that a write
// composes again only the modules it touched. While the copy loads, a
// node's reads are answered from its keys read alone (Verb.Early).
//
// A composition is compose.Compose's, fed from the copy through
// mirror.Mirror.Sources; the plans room digests the same composition.
// [Replay] answers the provisioning and compose verbs from a capture,
// without NATS.
package answers

// Package service serves the mesh-provisioner micro service: the read-only
// verbs mesh-provisioner.provisioning (the registry or a state bucket's
// records, narrowed) and mesh-provisioner.compose (a node's plan), answered
// from a watched in-memory copy of the five provisioning buckets.
//
// [Start] opens the buckets (create them first with buckets.Ensure), starts
// one watcher per bucket and adds the micro service with one endpoint per
// verb. Until every watcher has delivered its bucket's initial values the
// endpoints answer 503; after that, every answer comes from the copy, never
// from a read by key, in key order, and carries the revisions the copy had
// reached.
//
// An answer is one page: it never exceeds the NATS server's max_payload,
// whatever the request's page_size; next_page_token continues it (see
// docs/protocol.md). Requests are protobuf binary by default, or protobuf
// JSON when they carry the header Content-Type: application/json or their
// body starts with '{'; the answer uses the request's encoding. Errors follow
// the NATS service API (Nats-Service-Error and Nats-Service-Error-Code
// headers) with the codes of package wire.
//
// [Replay] answers the same verbs from a capture, without NATS.
package service

// Package service serves the mesh-provisioner micro service, the only
// writer of the mesh's buckets. Its read verbs, mesh-provisioner.provisioning
// (the registry or a state bucket's records, narrowed) and
// mesh-provisioner.compose (a node's plan), each on a node's own subject too
// (.<node>), and mesh-provisioner.provisions.<provider> (what one provider
// must provision), are answered from a watched in-memory copy of the five
// provisioning buckets and of the providers' buckets (package
// internal/mirror). Its write verbs, put, delete, apply and declare of a node
// and bind of a provider, check that the write is the asker's, whom the
// subject names, and that the copy would hold its key and value, then store
// it with the writing identity's connection (Config.WatchConn).
//
// [Start] opens the buckets (create them first with buckets.Ensure), starts
// their watchers and adds the micro service with one endpoint per verb.
// Until every watcher has delivered its bucket's initial values the
// endpoints answer 503, but an instance alone on the bus answers a node's
// reads from that node's keys read alone; after that, every answer comes
// from the copy, never from a read by key, in key order, and carries the
// revisions the copy had reached. [Service.RunPlans], which the seat's
// holder runs, keeps each node's plan digest in mesh-provisioner_plans.
//
// An answer is one page: it never exceeds the NATS server's max_payload,
// whatever the request's page_size; next_page_token continues it (see
// docs/protocol.md). Requests are protobuf binary by default, or protobuf
// JSON when they carry the header Content-Type: application/json or their
// body starts with '{'; the answer uses the request's encoding. Errors follow
// the NATS service API (Nats-Service-Error and Nats-Service-Error-Code
// headers) with the codes of package wire.
//
// [Replay] answers the provisioning and compose verbs from a capture,
// without NATS.
package service

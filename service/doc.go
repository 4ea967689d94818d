// Package service serves the mesh-provisioner micro service: the read-only
// verb mesh-provisioner.provisioning, answered from a watched in-memory copy
// of the registry and the three state buckets.
//
// [Start] opens the buckets (create them first with [EnsureBuckets]), starts
// one KV watcher per bucket and adds the micro service with its endpoint.
// Until every watcher has delivered the bucket's initial values the endpoint
// answers 503; after that, every answer comes from the copy, never from a
// read by key, in key order, and carries the revision the copy had reached.
//
// Requests are protobuf binary by default, or protobuf JSON when they carry
// the header Content-Type: application/json or their body starts with '{';
// the answer uses the request's encoding. Errors follow the NATS service API
// (Nats-Service-Error and Nats-Service-Error-Code headers) with the codes
// [CodeBadRequest], [CodeNotReady] and [CodeInternal].
package service

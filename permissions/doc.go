// Package permissions generates the NATS permissions of the identities of a
// provisioning mesh, granting each the least that works:
//
//   - [Node]: a node's provisioner client writes its own node's keys of the
//     three state buckets and asks the service; nothing else.
//   - [Server]: the mesh-provisioner server creates the buckets, writes the
//     registry, watches every bucket and answers its verbs.
//   - [Provider]: a provider module reads the needs and writes its own
//     <provider>_bound bucket, but writes no provisioning bucket.
//
// Every identity receives replies on its own inbox,
// "_INBOX_MESH.<role>.<name>.>" ([wire.InboxPrefix]), so that no identity
// reads another's replies, whatever the names of nodes, providers and the
// server; connect with nats.CustomInboxPrefix(wire.InboxPrefix(role, name)).
//
// [Permissions.Config] writes a permissions block for a nats-server
// configuration file; its JSON form is accepted by nats-server as well.
package permissions

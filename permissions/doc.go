// Package permissions generates the NATS permissions of the identities of a
// provisioning mesh, granting each the least that works:
//
//   - [Node]: a node's provisioner client writes its own node's keys of the
//     four state buckets and asks the service; nothing else.
//   - [Server]: the mesh-provisioner server's answering identity
//     subscribes to its verbs and discovery and publishes only to inboxes;
//     it writes nothing.
//   - [ServerWriter]: the server's writing identity creates the buckets,
//     writes the registry, holds the seat and watches every bucket; it
//     subscribes to nothing but its own inbox.
//   - [Provider]: a provider module reads the needs and writes its own
//     <provider>_bound bucket, but writes no provisioning bucket.
//
// No identity has allow_responses, and no request can make one publish
// anywhere but an inbox: the confused deputy, an asker who aims the
// service's answer at a JetStream API subject through the request's reply
// subject, is refused by nats-server (docs/security.md).
//
// Every identity receives replies on its own inbox,
// "_INBOX_MESH.<role>.<name>.>" ([wire.InboxPrefix]), so that no identity
// reads another's replies, whatever the names of nodes, providers and the
// server; connect with nats.CustomInboxPrefix(wire.InboxPrefix(role, name)).
//
// [Permissions.Config] writes a permissions block for a nats-server
// configuration file; its JSON form is accepted by nats-server as well.
package permissions

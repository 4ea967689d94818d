package wire

// Role is what an identity on the mesh is: its inbox prefix and its
// permissions follow from it.
type Role string

// The roles of the mesh's identities.
const (
	// RoleServer is the mesh-provisioner server.
	RoleServer Role = "server"
	// RoleNode is a node's provisioner client.
	RoleNode Role = "node"
	// RoleProvider is a provider module, which provisions bound needs.
	RoleProvider Role = "provider"
	// RoleOperator is a person or tool that reads the whole mesh: status,
	// query of any node, capture.
	RoleOperator Role = "operator"
)

// The server runs as two identities, so that the one that answers requests
// cannot write (docs/security.md, "Reply subjects and the server's two
// identities").
const (
	// ServerIdentity answers the verbs: it subscribes to them and to
	// micro discovery, and publishes only to ReplyPrefixes.
	ServerIdentity = ServiceName
	// WriterIdentity keeps the buckets: it watches them, holds the seat and
	// writes the registry, and subscribes to nothing but its own inbox.
	WriterIdentity = ServiceName + "-writer"
)

// ReplyPrefixes returns the subject prefixes the service answers to by
// default: the inboxes of every role that asks (nodes, providers,
// operators), nats.go's and the nats CLI's default "_INBOX.", and "_R_.",
// under which nats-server hands a request from another account to the
// exporting one. The server's own role is left out: nothing asks the verbs
// from there, and its writer's replies must stay its own. A request whose
// reply subject starts with none of them gets no answer, so that no asker can
// aim an answer at a JetStream API, KV or system subject.
func ReplyPrefixes() []string {
	return []string{
		InboxPrefix(RoleNode, ""), InboxPrefix(RoleProvider, ""), InboxPrefix(RoleOperator, ""),
		"_INBOX.", CrossAccountReplyPrefix,
	}
}

// CrossAccountReplyPrefix starts the reply subject nats-server gives a
// request that crossed a service import: the exporting account sees it,
// and nats-server delivers the answer to the asker's own reply subject in
// the asker's account.
const CrossAccountReplyPrefix = "_R_."

// InboxRoot starts every inbox prefix of the mesh's identities. It is not
// nats.go's default "_INBOX", which permissions never grant.
const InboxRoot = "_INBOX_MESH"

// InboxPrefix is the inbox prefix of an identity's connection: replies to it
// arrive on "<prefix>.>", which its permissions alone may subscribe to. The
// role is a token of its own, so a node, a provider and the server never
// share a prefix whatever their names; a name is a key token (no dots, no
// wildcards). Connect with nats.CustomInboxPrefix(wire.InboxPrefix(...)).
func InboxPrefix(role Role, name string) string {
	return InboxRoot + "." + string(role) + "." + name
}

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
)

// ServerIdentity is the name of the mesh-provisioner server's identity.
const ServerIdentity = ServiceName

// inboxRoot starts every inbox prefix of the mesh's identities. It is not
// nats.go's default "_INBOX", which permissions never grant.
const inboxRoot = "_INBOX_MESH"

// InboxPrefix is the inbox prefix of an identity's connection: replies to it
// arrive on "<prefix>.>", which its permissions alone may subscribe to. The
// role is a token of its own, so a node, a provider and the server never
// share a prefix whatever their names; a name is a key token (no dots, no
// wildcards). Connect with nats.CustomInboxPrefix(wire.InboxPrefix(...)).
func InboxPrefix(role Role, name string) string {
	return inboxRoot + "." + string(role) + "." + name
}

// Package nodeclient is what a node's provisioner client imports to write its
// own node's provisioning state: the needs of its modules, what is applied,
// and its collection items.
//
// A Client takes a connection the caller opened with the node's credentials,
// binds the four state buckets (it never creates or reconfigures them), and
// builds every key with package keys, so parts that no key can hold are
// refused with an error wrapping keys.ErrInvalidPart before anything is sent.
// The node's permissions (mesh-provisioner permissions --node) let it write
// only keys of its own node; connect with InboxPrefix so that replies reach it
// on the inbox its permissions grant:
//
//	nc, err := nats.Connect(url, nats.UserCredentials(creds),
//		nats.CustomInboxPrefix(nodeclient.InboxPrefix("ace")))
//	c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
//	rev, err := c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
package nodeclient

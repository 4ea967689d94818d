// Package nodeclient is what a node's provisioner client imports to write its
// own node's provisioning state: the needs of its modules, what is applied,
// its collection items, and the manifests of the providers it runs.
//
// A Client writes through the service's write verbs (mesh-provisioner.put.N,
// .delete.N, .apply.N and .declare.N.P), never into JetStream: the service
// checks that each write is the node's, its key's shape, its value and the
// node's budget, and stores it with its own identity (docs/security.md, "The
// service is the only writer"). It builds every key with package keys, so
// parts that no key can hold are refused with an error wrapping
// keys.ErrInvalidPart before anything is sent; a refusal of the service's is
// a *wire.Error with its code (400, 403, 413, or 503 to write again). Connect
// with InboxPrefix: the service answers a node's write only there.
//
//	nc, err := nats.Connect(url, nats.UserCredentials(creds),
//		nats.CustomInboxPrefix(nodeclient.InboxPrefix("ace")))
//	c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: "ace"})
//	rev, err := c.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
package nodeclient

package wire_test

import (
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/wire"
)

// A node asks its own subjects, and is answered on its own inbox only.
func ExampleInboxPrefix() {
	fmt.Println(wire.NodeSubject(wire.ComposeSubject, "ace"))
	fmt.Println(wire.InboxPrefix(wire.RoleNode, "ace"))
	fmt.Println(wire.ProviderSubject("postgres"))
	fmt.Println(wire.InboxPrefix(wire.RoleProvider, "postgres"))
	// Output:
	// mesh-provisioner.compose.ace
	// _INBOX_MESH.node.ace
	// mesh-provisioner.provisions.postgres
	// _INBOX_MESH.provider.postgres
}

// A refusal comes back as headers: ErrorOf reads it, CodeOf finds its code
// through any wrapping.
func ExampleErrorOf() {
	reply := nats.NewMsg("_INBOX_MESH.node.ace.1")
	reply.Header.Set(wire.ErrorCodeHeader, "403")
	reply.Header.Set(wire.ErrorHeader, `key "novox.web.port.http" is node novox's`)
	err := fmt.Errorf("put novox.web.port.http: %w", wire.ErrorOf(reply))

	fmt.Println(wire.CodeOf(err) == wire.CodeForbidden)
	var refusal *wire.Error
	if errors.As(err, &refusal) {
		fmt.Println(refusal.Sentence())
	}
	// Output:
	// true
	// key "novox.web.port.http" is node novox's
}

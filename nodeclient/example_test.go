package nodeclient_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/nodeclient"
)

// A node's connection carries the inbox prefix its permissions grant, so
// that the service's answers to its writes reach it, and no other node.
// (client's Example writes through a Client against a running service.)
func ExampleInboxPrefix() {
	fmt.Println(nodeclient.InboxPrefix("ace"))
	// Output: _INBOX_MESH.node.ace
}

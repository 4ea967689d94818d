package permissions_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/permissions"
)

func ExampleNode() {
	p, err := permissions.Node("ace")
	if err != nil {
		panic(err)
	}
	fmt.Println(p.Publish.Allow[0])
	fmt.Println(p.Subscribe.Allow)
	_, err = permissions.Node("ace.web")
	fmt.Println(err)
	// Output:
	// $KV.mesh-provisioner_needs.ace.>
	// [_INBOX_MESH.node.ace.> $KV.mesh-provisioner_plans.ace]
	// permissions for node: invalid key part: node "ace.web" holds '.' at byte 3; a token holds only A-Z a-z 0-9 - _ = /
}

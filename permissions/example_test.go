package permissions_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/permissions"
)

func ExampleNode() {
	p, err := permissions.Node("ace", "pg")
	if err != nil {
		panic(err)
	}
	for _, subject := range p.Publish.Allow {
		fmt.Println(subject)
	}
	fmt.Println(p.Publish.Deny)
	fmt.Println(p.Subscribe.Allow)
	_, err = permissions.Node("ace.web")
	fmt.Println(err)
	// Output:
	// mesh-provisioner.provisioning.ace
	// mesh-provisioner.compose.ace
	// mesh-provisioner.put.ace
	// mesh-provisioner.delete.ace
	// mesh-provisioner.apply.ace
	// mesh-provisioner.declare.ace.pg
	// [$JS.> $KV.> $SEAT.mesh-provisioner $SEAT.mesh-provisioner.>]
	// [_INBOX_MESH.node.ace.> $KV.mesh-provisioner_plans.ace]
	// permissions for node: invalid key part: node "ace.web" holds '.' at byte 3; a token holds only A-Z a-z 0-9 - _ = /
}

// In a mesh of 8 partitions, a node's grant names its verbs' subjects as
// nats-server maps them: its own partition's, and no other's.
func ExamplePermissions_Partitioned() {
	ace, err := permissions.Node("ace")
	if err != nil {
		panic(err)
	}
	for _, subject := range ace.Partitioned(8).Publish.Allow {
		fmt.Println(subject)
	}
	// Output:
	// mesh-provisioner.provisioning.ace.0
	// mesh-provisioner.compose.ace.0
	// mesh-provisioner.put.ace.0
	// mesh-provisioner.delete.ace.0
	// mesh-provisioner.apply.ace.0
}

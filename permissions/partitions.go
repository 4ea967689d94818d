package permissions

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/novox/mesh-provisioner/wire"
)

// Partitioned returns a node's or a provider's permissions in a mesh of n
// partitions (wire.PartitionMappings): each of its verbs' subjects as
// nats-server maps it, with its own partition appended. nats-server maps a
// subject before it checks the publisher's permissions, so the grant names
// the mapped subject: its own partition's, and no other's. n below 2 leaves
// the permissions as they are.
func (p Permissions) Partitioned(n int) Permissions {
	if n < 2 {
		return p
	}
	allow := make([]string, len(p.Publish.Allow))
	for i, subject := range p.Publish.Allow {
		allow[i] = wire.PartitionedSubject(subject, n)
	}
	p.Publish.Allow = allow
	return p
}

// CheckPartitions refuses a number of partitions a mesh cannot have.
func CheckPartitions(n int) error {
	if n < 0 || n > wire.MaxPartitions {
		return fmt.Errorf("partitions: %d is not between 0 (none) and %d", n, wire.MaxPartitions)
	}
	return nil
}

// MappingsConfig returns the nats-server "mappings" block of a mesh of n
// partitions, to stand at the top of the configuration (or in the account
// that holds the mesh); "" for fewer than 2.
func MappingsConfig(n int) string {
	if n < 2 {
		return ""
	}
	var b strings.Builder
	b.WriteString("mappings = {\n")
	for _, m := range wire.PartitionMappings(n) {
		fmt.Fprintf(&b, "  %s: %s\n", strconv.Quote(m.Source), strconv.Quote(m.Destination))
	}
	b.WriteString("}")
	return b.String()
}

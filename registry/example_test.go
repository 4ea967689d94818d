package registry_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/registry"
)

// The registry is a typed literal, validated before it is written: each
// kind once, owned by the module that answers it, its value found where
// the entry says.
func ExampleValidate() {
	fmt.Println(registry.Validate(registry.Table()) == nil)

	twice := append(registry.Table(), registry.Table()[0])
	fmt.Println(registry.Validate(twice) != nil)

	for _, entry := range registry.Table() {
		if entry.GetKind() == "port" {
			fmt.Println(entry.GetKind(), "is answered by", entry.GetOwner())
		}
	}
	// Output:
	// true
	// true
	// port is answered by mesh-controller
}

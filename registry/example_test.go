package registry_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/registry"
)

func ExampleKeyShape_Render() {
	shape, err := registry.ParseKeyShape("<node>.<module>.<provision>[.<local>]")
	if err != nil {
		panic(err)
	}
	key, _ := shape.Render(registry.Values{Node: "ace", Module: "web", Provision: "db"})
	fmt.Println(key)
	key, _ = shape.Render(registry.Values{Node: "ace", Module: "web", Provision: "db", Local: "ro"})
	fmt.Println(key)
	_, err = shape.Render(registry.Values{Node: "ace"})
	fmt.Println(err)
	// Output:
	// ace.web.db
	// ace.web.db.ro
	// cannot render key: <node>.<module>.<provision>[.<local>]: no value for <module>
}

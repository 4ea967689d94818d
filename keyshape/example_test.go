package keyshape_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/keyshape"
)

func ExampleShape_Render() {
	shape, err := keyshape.Parse("<node>.<module>.<provision>[.<local>]")
	if err != nil {
		panic(err)
	}
	key, _ := shape.Render(keyshape.Values{Node: "ace", Module: "web", Provision: "db"})
	fmt.Println(key)
	key, _ = shape.Render(keyshape.Values{Node: "ace", Module: "web", Provision: "db", Local: "ro"})
	fmt.Println(key)
	_, err = shape.Render(keyshape.Values{Node: "ace"})
	fmt.Println(err)
	// Output:
	// ace.web.db
	// ace.web.db.ro
	// cannot render key: <node>.<module>.<provision>[.<local>]: no value for <module>
}

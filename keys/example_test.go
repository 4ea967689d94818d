package keys_test

import (
	"fmt"

	"github.com/novox/mesh-provisioner/keys"
)

func ExampleCollectKey_Key() {
	key, err := keys.CollectKey{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web"}.Key()
	if err != nil {
		panic(err)
	}
	fmt.Println(key)
	back, _ := keys.ParseCollectKey(key)
	fmt.Println(back.Collection)
	// Output:
	// ace.shell=3Azsh=3Anormal.web
	// shell:zsh:normal
}

func ExampleParseNeedKey() {
	_, err := keys.ParseNeedKey("ace.web.port")
	fmt.Println(err)
	// Output:
	// malformed key: "ace.web.port" has 3 tokens, want 4 (<node>.<module>.<kind>.<name>)
}

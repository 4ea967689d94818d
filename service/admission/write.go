package admission

import (
	"fmt"

	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// OwnKey checks a key's shape in bucket and that node owns it: a node or
// provider writes only its own keys.
func OwnKey(bucket, node, key string) *wire.Error {
	if werr := CheckName("key", key, false); werr != nil {
		return werr
	}
	owner, err := mirror.CheckKey(bucket, key)
	if err != nil {
		return wire.Errorf(wire.CodeBadRequest, "key %q of %s: %v", keys.Echo(key), bucket, err)
	}
	if owner != node {
		node := keys.Echo(node)
		return wire.Errorf(wire.CodeForbidden, "key %q is node %s's: on mesh-provisioner.*.%s, node %s writes only keys that start with %q", keys.Echo(key), keys.Echo(owner), node, node, node+".")
	}
	return nil
}

// A Bucket is what CheckValue reads of a state bucket.
type Bucket struct {
	Name string
	// MaxValue is the largest value the bucket takes; zero: no bound.
	MaxValue int
	// Held is the copy's holding of the bucket, which keeps each node
	// within its budget.
	Held interface {
		Fits(node, key string, size int) bool
		Budget() mirror.Budget
	}
}

// CheckValue refuses a value over the bucket's largest, one that does not
// decode as the copy would, and one its node's budget has no room for.
func CheckValue(b Bucket, node, key string, value []byte) *wire.Error {
	if b.MaxValue > 0 && len(value) > b.MaxValue {
		return wire.Errorf(wire.CodeTooLarge, "the value of %s is %d bytes, more than the %s %s takes of one value: write a smaller one, or have the operator raise it (serve --max-value-size)",
			keys.Echo(key), len(value), ByteSize(b.MaxValue), b.Name)
	}
	if _, err := mirror.CheckRecord(b.Name, key, value); err != nil {
		return wire.Errorf(wire.CodeBadRequest, "the value of %s: %v", keys.Echo(key), err)
	}
	if !b.Held.Fits(node, key, len(value)) {
		return wire.Errorf(wire.CodeTooLarge, "node %s has no room for %s in %s: it would hold more than the server keeps of one node there, %s (--node-max-keys, --node-max-bytes); delete some of its keys first", keys.Echo(node), keys.Echo(key), b.Name, b.Held.Budget())
	}
	return nil
}

// ByteSize says a size limit as a refusal names it: "64 KiB (65536 bytes)",
// or "100 bytes" for one that is no whole number of KiB.
func ByteSize(n int) string {
	if n >= 1<<10 && n%(1<<10) == 0 {
		return fmt.Sprintf("%d KiB (%d bytes)", n>>10, n)
	}
	return fmt.Sprintf("%d bytes", n)
}

package mirror

import (
	"fmt"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// CheckRecord decodes a record of a state bucket as the copy would, and
// returns the node its key names; the error is what the copy would report
// the record malformed for. The write verbs refuse such a record before
// anything is stored.
func CheckRecord(bucket, key string, value []byte) (node string, err error) {
	switch bucket {
	case keys.NeedsBucket:
		r, err := decodeNeed(key, value, 0)
		return r.GetNode(), err
	case keys.AppliedBucket:
		r, err := decodeApplied(key, value, 0)
		return r.GetNode(), err
	case keys.CollectBucket:
		r, err := decodeCollect(key, value, 0)
		return r.GetNode(), err
	case keys.ManifestsBucket:
		k, err := keys.ParseManifestKey(key)
		if err != nil {
			return "", err
		}
		return k.Node, decodeValue(value, &provisionerv1.Manifest{})
	}
	return "", fmt.Errorf("%q is not a state bucket", bucket)
}

// CheckKey checks a key of a state bucket alone, as a delete names it, and
// returns the node it names.
func CheckKey(bucket, key string) (node string, err error) {
	switch bucket {
	case keys.NeedsBucket:
		k, err := keys.ParseNeedKey(key)
		return k.Node, err
	case keys.AppliedBucket:
		k, err := keys.ParseAppliedKey(key)
		return k.Node, err
	case keys.CollectBucket:
		k, err := keys.ParseCollectKey(key)
		return k.Node, err
	case keys.ManifestsBucket:
		k, err := keys.ParseManifestKey(key)
		return k.Node, err
	}
	return "", fmt.Errorf("%q is not a state bucket", bucket)
}

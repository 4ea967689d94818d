package mirror

import (
	"fmt"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// decodeValue unmarshals a bucket value into msg, saying which type failed.
// The sentence leaves out the protobuf library's own, whose wording varies
// from build to build by design: answers that report it stay the same.
func decodeValue(value []byte, msg proto.Message) error {
	if err := proto.Unmarshal(value, msg); err != nil {
		return fmt.Errorf("value of %d bytes does not decode as %s", len(value), msg.ProtoReflect().Descriptor().FullName())
	}
	return nil
}

func decodeRegistry(key string, value []byte, revision uint64) (*provisionerv1.RegistryRecord, error) {
	kind, err := keys.ParseRegistryKey(key)
	if err != nil {
		return nil, err
	}
	entry := &provisionerv1.RegistryEntry{}
	if err := decodeValue(value, entry); err != nil {
		return nil, err
	}
	if entry.GetKind() != kind {
		return nil, fmt.Errorf("key %q holds the entry of kind %q", key, entry.GetKind())
	}
	return &provisionerv1.RegistryRecord{Kind: kind, Entry: entry, Revision: revision}, nil
}

func decodeNeed(key string, value []byte, revision uint64) (*provisionerv1.NeedRecord, error) {
	k, err := keys.ParseNeedKey(key)
	if err != nil {
		return nil, err
	}
	need := &provisionerv1.Need{}
	if err := decodeValue(value, need); err != nil {
		return nil, err
	}
	return &provisionerv1.NeedRecord{Node: k.Node, Module: k.Module, Kind: k.Kind, Name: k.Name, Need: need, Revision: revision}, nil
}

func decodeApplied(key string, value []byte, revision uint64) (*provisionerv1.AppliedRecord, error) {
	k, err := keys.ParseAppliedKey(key)
	if err != nil {
		return nil, err
	}
	applied := &provisionerv1.Applied{}
	if err := decodeValue(value, applied); err != nil {
		return nil, err
	}
	return &provisionerv1.AppliedRecord{Node: k.Node, Module: k.Module, Applied: applied, Revision: revision}, nil
}

func decodeCollect(key string, value []byte, revision uint64) (*provisionerv1.CollectRecord, error) {
	k, err := keys.ParseCollectKey(key)
	if err != nil {
		return nil, err
	}
	item := &provisionerv1.CollectItem{}
	if err := decodeValue(value, item); err != nil {
		return nil, err
	}
	return &provisionerv1.CollectRecord{Node: k.Node, Collection: k.Collection, Contributor: k.Contributor, Item: item, Revision: revision}, nil
}

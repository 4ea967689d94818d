package nodeclient

import (
	"context"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// InboxPrefix is the inbox prefix of a node's connection: replies to it
// arrive on "<prefix>.>", which its permissions alone may subscribe to, so
// that no other identity reads its replies.
func InboxPrefix(node string) string { return wire.InboxPrefix(wire.RoleNode, node) }

// Config holds what New needs.
type Config struct {
	// Conn is a connection opened with the node's credentials. Required;
	// the caller owns it.
	Conn *nats.Conn
	// Node is the node this client writes for. Required.
	Node string
	// APIPrefix is where the provisioner's JetStream is reached when the
	// server runs in an account of its own (runs-as): wire.RunsAsAPIPrefix,
	// under which the mesh account imports the provisioner's (see
	// permissions.RunsAs). Empty means the node's own account holds the
	// buckets.
	APIPrefix string
}

// Client writes one node's keys of the state buckets.
type Client struct {
	node                             string
	needs, applied, items, manifests jetstream.KeyValue
}

// New binds the four state buckets. It fails if a bucket does not exist:
// the mesh-provisioner server creates them.
func New(ctx context.Context, cfg Config) (*Client, error) {
	if cfg.Conn == nil {
		return nil, errors.New("nodeclient: Config.Conn is required")
	}
	if _, err := keys.NodeFilter(cfg.Node); err != nil {
		return nil, fmt.Errorf("nodeclient: %w", err)
	}
	var js jetstream.JetStream
	var err error
	if cfg.APIPrefix == "" {
		js, err = jetstream.New(cfg.Conn)
	} else {
		js, err = jetstream.NewWithAPIPrefix(cfg.Conn, cfg.APIPrefix)
	}
	if err != nil {
		return nil, err
	}
	c := &Client{node: cfg.Node}
	for _, b := range []struct {
		name string
		kv   *jetstream.KeyValue
	}{{keys.NeedsBucket, &c.needs}, {keys.AppliedBucket, &c.applied}, {keys.CollectBucket, &c.items}, {keys.ManifestsBucket, &c.manifests}} {
		if *b.kv, err = js.KeyValue(ctx, b.name); err != nil {
			return nil, fmt.Errorf("nodeclient: bind bucket %s: %w", b.name, err)
		}
	}
	return c, nil
}

// Node returns the node the client writes for.
func (c *Client) Node() string { return c.node }

// PutNeed writes what module needs for the placeholder ${kind:name} and
// returns the revision it was written at.
func (c *Client) PutNeed(ctx context.Context, module, kind, name string, need *provisionerv1.Need) (uint64, error) {
	key, err := keys.NeedKey{Node: c.node, Module: module, Kind: kind, Name: name}.Key()
	if err != nil {
		return 0, err
	}
	return put(ctx, c.needs, key, need)
}

// DeleteNeed deletes a need.
func (c *Client) DeleteNeed(ctx context.Context, module, kind, name string) error {
	key, err := keys.NeedKey{Node: c.node, Module: module, Kind: kind, Name: name}.Key()
	if err != nil {
		return err
	}
	return del(ctx, c.needs, key)
}

// PutApplied writes what is applied of module and returns the revision it
// was written at.
func (c *Client) PutApplied(ctx context.Context, module string, applied *provisionerv1.Applied) (uint64, error) {
	key, err := keys.AppliedKey{Node: c.node, Module: module}.Key()
	if err != nil {
		return 0, err
	}
	return put(ctx, c.applied, key, applied)
}

// DeleteApplied deletes what is applied of module.
func (c *Client) DeleteApplied(ctx context.Context, module string) error {
	key, err := keys.AppliedKey{Node: c.node, Module: module}.Key()
	if err != nil {
		return err
	}
	return del(ctx, c.applied, key)
}

// PutCollectItem writes contributor's item of a collection, by its readable
// name such as "shell:zsh:normal", and returns the revision it was written at.
func (c *Client) PutCollectItem(ctx context.Context, collection, contributor string, item *provisionerv1.CollectItem) (uint64, error) {
	key, err := keys.CollectKey{Node: c.node, Collection: collection, Contributor: contributor}.Key()
	if err != nil {
		return 0, err
	}
	return put(ctx, c.items, key, item)
}

// DeleteCollectItem deletes contributor's item of a collection.
func (c *Client) DeleteCollectItem(ctx context.Context, collection, contributor string) error {
	key, err := keys.CollectKey{Node: c.node, Collection: collection, Contributor: contributor}.Key()
	if err != nil {
		return err
	}
	return del(ctx, c.items, key)
}

// PutManifest writes the manifest of provider, a module this node runs, and
// returns its digest (wire.ManifestDigest of the bytes written: what
// compositions name in Provision.manifest_digest) and the revision it was
// written at.
func (c *Client) PutManifest(ctx context.Context, provider string, manifest *provisionerv1.Manifest) (digest string, revision uint64, err error) {
	key, err := keys.ManifestKey{Node: c.node, Provider: provider}.Key()
	if err != nil {
		return "", 0, err
	}
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(manifest)
	if err != nil {
		return "", 0, fmt.Errorf("encode %s: %w", key, err)
	}
	revision, err = c.manifests.Put(ctx, key, data)
	if err != nil {
		return "", 0, fmt.Errorf("put %s: %w", key, err)
	}
	return wire.ManifestDigest(data), revision, nil
}

// DeleteManifest deletes the manifest of provider.
func (c *Client) DeleteManifest(ctx context.Context, provider string) error {
	key, err := keys.ManifestKey{Node: c.node, Provider: provider}.Key()
	if err != nil {
		return err
	}
	return del(ctx, c.manifests, key)
}

func put(ctx context.Context, kv jetstream.KeyValue, key string, value proto.Message) (uint64, error) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(value)
	if err != nil {
		return 0, fmt.Errorf("encode %s: %w", key, err)
	}
	rev, err := kv.Put(ctx, key, data)
	if err != nil {
		return 0, fmt.Errorf("put %s in %s: %w", key, kv.Bucket(), err)
	}
	return rev, nil
}

func del(ctx context.Context, kv jetstream.KeyValue, key string) error {
	if err := kv.Delete(ctx, key); err != nil {
		return fmt.Errorf("delete %s in %s: %w", key, kv.Bucket(), err)
	}
	return nil
}

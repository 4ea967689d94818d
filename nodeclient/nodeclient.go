package nodeclient

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// InboxPrefix is the inbox prefix of a node's connection: replies to it
// arrive on "<prefix>.>", which its permissions alone may subscribe to, so
// that no other identity reads its replies. The service answers a node's
// write only into this prefix.
func InboxPrefix(node string) string { return wire.InboxPrefix(wire.RoleNode, node) }

// DefaultTimeout bounds a write whose context has no deadline.
const DefaultTimeout = 5 * time.Second

// Config holds what New needs.
type Config struct {
	// Conn is a connection opened with the node's credentials and
	// InboxPrefix. Required; the caller owns it.
	Conn *nats.Conn
	// Node is the node this client writes for. Required.
	Node string
}

// Client writes one node's records through the service's write verbs.
type Client struct {
	nc   *nats.Conn
	node string
	// written is, by module, the revision of the last write of its needs
	// this client was answered: an apply names it, and the service
	// compares the set with its copy once the copy holds it, rather than
	// first asking the bucket (ApplyRequest.min_revision).
	mu      sync.Mutex
	written map[string]uint64
}

// New returns a client of cfg.Node. It sends nothing: the service checks
// each write when it comes.
func New(_ context.Context, cfg Config) (*Client, error) {
	if cfg.Conn == nil {
		return nil, errors.New("nodeclient: Config.Conn is required")
	}
	if _, err := keys.NodeFilter(cfg.Node); err != nil {
		return nil, fmt.Errorf("nodeclient: %w", err)
	}
	return &Client{nc: cfg.Conn, node: cfg.Node, written: map[string]uint64{}}, nil
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
	revision, err := c.put(ctx, provisionerv1.What_WHAT_NEEDS, key, need)
	c.wrote(module, revision, err)
	return revision, err
}

// DeleteNeed deletes a need and returns the revision of its delete marker.
func (c *Client) DeleteNeed(ctx context.Context, module, kind, name string) (uint64, error) {
	key, err := keys.NeedKey{Node: c.node, Module: module, Kind: kind, Name: name}.Key()
	if err != nil {
		return 0, err
	}
	revision, err := c.delete(ctx, provisionerv1.What_WHAT_NEEDS, key)
	c.wrote(module, revision, err)
	return revision, err
}

// ModuleNeed is one need of a module's set (ApplyNeeds): the placeholder
// ${Kind:Name} and what the module needs for it.
type ModuleNeed struct {
	Kind, Name string
	Need       *provisionerv1.Need
}

// ApplyNeeds makes needs the whole set of module's needs: the service
// writes each that differs from the one stored, deletes each of the
// module's that the set does not hold, and says what it changed and at
// which revision. An empty set deletes every need of the module.
func (c *Client) ApplyNeeds(ctx context.Context, module string, needs []ModuleNeed) (*provisionerv1.ApplyResponse, error) {
	req := &provisionerv1.ApplyRequest{Module: module, Needs: make([]*provisionerv1.Record, 0, len(needs)), MinRevision: c.lastWrite(module)}
	for _, n := range needs {
		key, err := keys.NeedKey{Node: c.node, Module: module, Kind: n.Kind, Name: n.Name}.Key()
		if err != nil {
			return nil, err
		}
		value, err := encode(key, n.Need)
		if err != nil {
			return nil, err
		}
		req.Needs = append(req.Needs, &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: key, Value: value})
	}
	out := &provisionerv1.ApplyResponse{}
	if err := c.call(ctx, wire.NodeSubject(wire.ApplySubject, c.node), req, out); err != nil {
		c.wrote(module, 0, err)
		return nil, fmt.Errorf("apply module %s's needs: %w", module, err)
	}
	if out.GetWritten()+out.GetDeleted() > 0 {
		// Else the revision is the copy's, which may be past the
		// module's last write: another instance's copy need not wait.
		c.wrote(module, out.GetRevision(), nil)
	}
	return out, nil
}

// wrote keeps revision as module's last write of needs, if it is newer.
// A write that failed may have been stored all the same (its answer
// lost, or an apply stored in part): the module's last write is then
// unknown, and the next apply has the service read it.
func (c *Client) wrote(module string, revision uint64, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		delete(c.written, module)
		return
	}
	c.written[module] = max(c.written[module], revision)
}

// lastWrite returns the revision of module's last write of needs this
// client was answered, or zero.
func (c *Client) lastWrite(module string) uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.written[module]
}

// PutApplied writes what is applied of module and returns the revision it
// was written at.
func (c *Client) PutApplied(ctx context.Context, module string, applied *provisionerv1.Applied) (uint64, error) {
	key, err := keys.AppliedKey{Node: c.node, Module: module}.Key()
	if err != nil {
		return 0, err
	}
	return c.put(ctx, provisionerv1.What_WHAT_APPLIED, key, applied)
}

// DeleteApplied deletes what is applied of module and returns the revision
// of its delete marker.
func (c *Client) DeleteApplied(ctx context.Context, module string) (uint64, error) {
	key, err := keys.AppliedKey{Node: c.node, Module: module}.Key()
	if err != nil {
		return 0, err
	}
	return c.delete(ctx, provisionerv1.What_WHAT_APPLIED, key)
}

// PutCollectItem writes contributor's item of a collection, by its readable
// name such as "shell:zsh:normal", and returns the revision it was written at.
func (c *Client) PutCollectItem(ctx context.Context, collection, contributor string, item *provisionerv1.CollectItem) (uint64, error) {
	key, err := keys.CollectKey{Node: c.node, Collection: collection, Contributor: contributor}.Key()
	if err != nil {
		return 0, err
	}
	return c.put(ctx, provisionerv1.What_WHAT_COLLECT, key, item)
}

// DeleteCollectItem deletes contributor's item of a collection and returns
// the revision of its delete marker.
func (c *Client) DeleteCollectItem(ctx context.Context, collection, contributor string) (uint64, error) {
	key, err := keys.CollectKey{Node: c.node, Collection: collection, Contributor: contributor}.Key()
	if err != nil {
		return 0, err
	}
	return c.delete(ctx, provisionerv1.What_WHAT_COLLECT, key)
}

// PutManifest declares the manifest of provider, a module this node runs,
// and returns its digest (wire.ManifestDigest of the bytes stored: what
// compositions name in Provision.manifest_digest) and the revision it was
// written at. The node's permissions must name the provider
// (permissions --node N --hosts P).
func (c *Client) PutManifest(ctx context.Context, provider string, manifest *provisionerv1.Manifest) (digest string, revision uint64, err error) {
	key, err := keys.ManifestKey{Node: c.node, Provider: provider}.Key()
	if err != nil {
		return "", 0, err
	}
	data, err := encode(key, manifest)
	if err != nil {
		return "", 0, err
	}
	out := &provisionerv1.WriteResponse{}
	if err := c.call(ctx, wire.DeclareSubjectOf(c.node, provider), &provisionerv1.DeclareRequest{Manifest: data}, out); err != nil {
		return "", 0, fmt.Errorf("declare %s: %w", key, err)
	}
	return out.GetDigest(), out.GetRevision(), nil
}

// DeleteManifest withdraws the node's manifest of provider and returns the
// revision of its delete marker.
func (c *Client) DeleteManifest(ctx context.Context, provider string) (uint64, error) {
	key, err := keys.ManifestKey{Node: c.node, Provider: provider}.Key()
	if err != nil {
		return 0, err
	}
	out := &provisionerv1.WriteResponse{}
	if err := c.call(ctx, wire.DeclareSubjectOf(c.node, provider), &provisionerv1.DeclareRequest{Withdraw: true}, out); err != nil {
		return 0, fmt.Errorf("withdraw %s: %w", key, err)
	}
	return out.GetRevision(), nil
}

func (c *Client) put(ctx context.Context, what provisionerv1.What, key string, value proto.Message) (uint64, error) {
	data, err := encode(key, value)
	if err != nil {
		return 0, err
	}
	out := &provisionerv1.WriteResponse{}
	req := &provisionerv1.PutRequest{Record: &provisionerv1.Record{What: what, Key: key, Value: data}}
	if err := c.call(ctx, wire.NodeSubject(wire.PutSubject, c.node), req, out); err != nil {
		return 0, fmt.Errorf("put %s: %w", key, err)
	}
	return out.GetRevision(), nil
}

func (c *Client) delete(ctx context.Context, what provisionerv1.What, key string) (uint64, error) {
	out := &provisionerv1.WriteResponse{}
	if err := c.call(ctx, wire.NodeSubject(wire.DeleteSubject, c.node), &provisionerv1.DeleteRequest{What: what, Key: key}, out); err != nil {
		return 0, fmt.Errorf("delete %s: %w", key, err)
	}
	return out.GetRevision(), nil
}

// encode writes a record's value deterministically, so that the same record
// is the same bytes, which an apply finds unchanged.
func encode(key string, value proto.Message) ([]byte, error) {
	data, err := proto.MarshalOptions{Deterministic: true}.Marshal(value)
	if err != nil {
		return nil, fmt.Errorf("encode %s: %w", key, err)
	}
	return data, nil
}

// call sends req to subject, a verb of the client's node, with
// DefaultTimeout when ctx has no deadline (wire.Call).
func (c *Client) call(ctx context.Context, subject string, req, answer proto.Message) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	return wire.Call(ctx, c.nc, wire.RoleNode, c.node, subject, req, answer)
}

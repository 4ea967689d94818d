package client

import (
	"context"
	"errors"
	"fmt"
	"iter"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/wire"
)

// Client calls the mesh-provisioner service over a connection the caller
// opened (with its credentials and inbox prefix: see Inbox) and owns.
type Client struct {
	nc             *nats.Conn
	subject        string
	composeSubject string
	// node, if set, is the node the client asks as: its requests go to the
	// node-addressed subjects, which a node's permissions grant.
	node string
	// apiPrefix is where the plans' key subjects are heard; empty:
	// the connection's own account (WithAPIPrefix).
	apiPrefix string
}

// Inbox returns the connection option that gives an identity of the mesh its
// inbox prefix, the one its permissions let it subscribe to:
// nats.Connect(url, client.Inbox(wire.RoleNode, "ace"), ...). Without it
// nats.go's "_INBOX" is used, which no generated permission set grants.
func Inbox(role wire.Role, name string) nats.Option {
	return nats.CustomInboxPrefix(wire.InboxPrefix(role, name))
}

// AsNode makes the client ask as node: both verbs on the node's own
// subjects (mesh-provisioner.provisioning.<node>, mesh-provisioner.compose.<node>),
// which is all a node's permissions grant. The service then answers only
// what is the node's own (and the registry), and refuses the rest with a
// 403.
func AsNode(node string) Option {
	return func(c *Client) { c.node = node }
}

// ErrNoProvider is returned by Provisions for a request that names no
// provider: the provider is the verb's subject.
var ErrNoProvider = errors.New("client: ProvisionsRequest.Provider is required: it names the subject asked")

// Option configures a Client.
type Option func(*Client)

// WithSubjects sets the verbs' subjects, for a service behind a subject
// mapping or an account import.
func WithSubjects(provisioning, compose string) Option {
	return func(c *Client) { c.subject, c.composeSubject = provisioning, compose }
}

// WithAPIPrefix sets where WatchPlan hears the plan's key:
// wire.RunsAsAPIPrefix when the server runs in an account of its own
// (permissions.RunsAs), under which each node's account imports its plan
// key's subject. Empty, the default: in the client's own account.
func WithAPIPrefix(prefix string) Option {
	return func(c *Client) { c.apiPrefix = prefix }
}

// New returns a client on nc.
func New(nc *nats.Conn, opts ...Option) *Client {
	c := &Client{nc: nc, subject: wire.ProvisioningSubject, composeSubject: wire.ComposeSubject}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// Subject returns the subject of the provisioning verb the client asks.
func (c *Client) Subject() string { return c.addressed(c.subject) }

// addressed returns a verb's subject as the client asks it: the node's own
// with AsNode.
func (c *Client) addressed(subject string) string {
	if c.node == "" {
		return subject
	}
	return wire.NodeSubject(subject, c.node)
}

// Provisioning asks the provisioning verb for one page: the first, or the
// one req.PageToken names. It returns a *wire.Error for a request the
// service refused, or a transport error (such as nats.ErrNoResponders when no
// instance runs). ctx bounds the wait; give it a deadline.
func (c *Client) Provisioning(ctx context.Context, req *provisionerv1.ProvisioningRequest) (*provisionerv1.ProvisioningResponse, error) {
	answer := &provisionerv1.ProvisioningResponse{}
	if err := c.call(ctx, c.addressed(c.subject), wire.RoleNode, c.node, req, answer); err != nil {
		return nil, err
	}
	return answer, nil
}

// ProvisioningPages asks for every page of an answer in turn, from
// req.PageToken on. It stops after the last page or the first error.
func (c *Client) ProvisioningPages(ctx context.Context, req *provisionerv1.ProvisioningRequest) iter.Seq2[*provisionerv1.ProvisioningResponse, error] {
	return pages(ctx, req, c.Provisioning, func(r *provisionerv1.ProvisioningRequest, t string) { r.PageToken = t })
}

// ProvisioningAll asks for every page and returns them joined as one answer
// (JoinProvisioningPages).
func (c *Client) ProvisioningAll(ctx context.Context, req *provisionerv1.ProvisioningRequest) (*provisionerv1.ProvisioningResponse, error) {
	return all(c.ProvisioningPages(ctx, req), JoinProvisioningPages)
}

// Compose asks the compose verb for one page of a node's composition: the
// first, or the one req.PageToken names.
func (c *Client) Compose(ctx context.Context, req *provisionerv1.ComposeRequest) (*provisionerv1.ComposeResponse, error) {
	answer := &provisionerv1.ComposeResponse{}
	if err := c.call(ctx, c.addressed(c.composeSubject), wire.RoleNode, c.node, req, answer); err != nil {
		return nil, err
	}
	return answer, nil
}

// ComposePages asks for every page of a composition in turn.
func (c *Client) ComposePages(ctx context.Context, req *provisionerv1.ComposeRequest) iter.Seq2[*provisionerv1.ComposeResponse, error] {
	return pages(ctx, req, c.Compose, func(r *provisionerv1.ComposeRequest, t string) { r.PageToken = t })
}

// ComposeAll asks for every page and joins them as one composition
// (JoinComposePages): a module's plan that continues on the next page is one
// plan.
func (c *Client) ComposeAll(ctx context.Context, req *provisionerv1.ComposeRequest) (*provisionerv1.ComposeResponse, error) {
	return all(c.ComposePages(ctx, req), JoinComposePages)
}

// Provisions asks a provider's verb, mesh-provisioner.provisions.<provider>
// (req.Provider's), for one page of what the provider must provision across
// the mesh: the first, or the one req.PageToken names.
func (c *Client) Provisions(ctx context.Context, req *provisionerv1.ProvisionsRequest) (*provisionerv1.ProvisionsResponse, error) {
	if req.GetProvider() == "" {
		return nil, ErrNoProvider
	}
	answer := &provisionerv1.ProvisionsResponse{}
	if err := c.call(ctx, wire.ProviderSubject(req.GetProvider()), wire.RoleProvider, req.GetProvider(), req, answer); err != nil {
		return nil, err
	}
	return answer, nil
}

// ProvisionsPages asks for every page of a provider's provisions in turn.
func (c *Client) ProvisionsPages(ctx context.Context, req *provisionerv1.ProvisionsRequest) iter.Seq2[*provisionerv1.ProvisionsResponse, error] {
	return pages(ctx, req, c.Provisions, func(r *provisionerv1.ProvisionsRequest, t string) { r.PageToken = t })
}

// ProvisionsAll asks for every page of a provider's provisions and joins
// them as one answer (JoinProvisionsPages).
func (c *Client) ProvisionsAll(ctx context.Context, req *provisionerv1.ProvisionsRequest) (*provisionerv1.ProvisionsResponse, error) {
	return all(c.ProvisionsPages(ctx, req), JoinProvisionsPages)
}

// all collects every page, or the first error, and joins them.
func all[Res any](pages iter.Seq2[Res, error], join func([]Res) Res) (Res, error) {
	var got []Res
	for page, err := range pages {
		if err != nil {
			var none Res
			return none, err
		}
		got = append(got, page)
	}
	return join(got), nil
}

// paged is an answer that may have more pages.
type paged interface {
	proto.Message
	GetNextPageToken() string
}

// pages iterates the pages of a verb's answer: each request is req with the
// previous page's next_page_token.
func pages[Req proto.Message, Res paged](ctx context.Context, req Req, ask func(context.Context, Req) (Res, error), setToken func(Req, string)) iter.Seq2[Res, error] {
	return func(yield func(Res, error) bool) {
		next := proto.Clone(req).(Req)
		for {
			page, err := ask(ctx, next)
			if !yield(page, err) || err != nil || page.GetNextPageToken() == "" {
				return
			}
			setToken(next, page.GetNextPageToken())
		}
	}
}

// call sends req to subject, an identity's own (role and name; no name: a
// bare subject), answered on that identity's inbox (wire.Call).
func (c *Client) call(ctx context.Context, subject string, role wire.Role, name string, req, answer proto.Message) error {
	return wire.Call(ctx, c.nc, role, name, subject, req, answer)
}

// Bind writes key of provider's bucket <provider>_bound through the
// service (mesh-provisioner.bind.<provider>, which a provider's permissions
// grant for its own name only), and returns the revision it was written
// at: compose with it in min_revisions.bound to see it bound. The service
// stores the value as given and keeps none.
func (c *Client) Bind(ctx context.Context, provider, key string, value []byte) (uint64, error) {
	return c.bind(ctx, provider, &provisionerv1.BindRequest{Key: key, Value: value})
}

// Unbind removes key of provider's bucket, and returns the revision of its
// delete marker.
func (c *Client) Unbind(ctx context.Context, provider, key string) (uint64, error) {
	return c.bind(ctx, provider, &provisionerv1.BindRequest{Key: key, Unbind: true})
}

func (c *Client) bind(ctx context.Context, provider string, req *provisionerv1.BindRequest) (uint64, error) {
	out := &provisionerv1.WriteResponse{}
	if err := c.call(ctx, wire.BindSubject+"."+provider, wire.RoleProvider, provider, req, out); err != nil {
		return 0, fmt.Errorf("bind %s of %s: %w", req.GetKey(), wire.BoundBucket(provider), err)
	}
	return out.GetRevision(), nil
}

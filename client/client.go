package client

import (
	"context"
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/service"
)

// ServiceError is an error the service answered with: its numeric code (400
// bad request, 503 not ready, 500 internal) and its sentence.
type ServiceError struct {
	Code        int
	Description string
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("mesh-provisioner: %d: %s", e.Code, e.Description)
}

// Client calls the mesh-provisioner service over a connection the caller
// opened (with its credentials) and owns.
type Client struct {
	nc             *nats.Conn
	subject        string
	composeSubject string
}

// Option configures a Client.
type Option func(*Client)

// WithSubjects sets the verbs' subjects, for a service behind a subject
// mapping or an account import.
func WithSubjects(provisioning, compose string) Option {
	return func(c *Client) { c.subject, c.composeSubject = provisioning, compose }
}

// New returns a client on nc.
func New(nc *nats.Conn, opts ...Option) *Client {
	c := &Client{nc: nc, subject: service.ProvisioningSubject, composeSubject: service.ComposeSubject}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// Subject returns the subject of the provisioning verb the client asks.
func (c *Client) Subject() string { return c.subject }

// Provisioning asks the provisioning verb and returns its answer, or a
// *ServiceError for an answer the service refused, or a transport error (such
// as nats.ErrNoResponders when no instance runs). ctx bounds the wait; give
// it a deadline.
func (c *Client) Provisioning(ctx context.Context, req *provisionerv1.ProvisioningRequest) (*provisionerv1.ProvisioningResponse, error) {
	answer := &provisionerv1.ProvisioningResponse{}
	if err := c.call(ctx, c.subject, req, answer); err != nil {
		return nil, err
	}
	return answer, nil
}

// call sends req in protobuf binary and decodes the answer into answer.
func (c *Client) call(ctx context.Context, subject string, req, answer proto.Message) error {
	data, err := proto.Marshal(req)
	if err != nil {
		return fmt.Errorf("encode request: %w", err)
	}
	msg := nats.NewMsg(subject)
	msg.Data = data
	msg.Header.Set("Content-Type", service.ContentTypeProtobuf)
	reply, err := c.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return err
	}
	if err := ErrorOf(reply); err != nil {
		return err
	}
	if err := proto.Unmarshal(reply.Data, answer); err != nil {
		return fmt.Errorf("decode answer: %w", err)
	}
	return nil
}

// ErrorOf returns the *ServiceError a reply carries in its
// Nats-Service-Error headers, or nil.
func ErrorOf(reply *nats.Msg) error {
	description := reply.Header.Get(micro.ErrorHeader)
	codeText := reply.Header.Get(micro.ErrorCodeHeader)
	if description == "" && codeText == "" {
		return nil
	}
	code, err := strconv.Atoi(codeText)
	if err != nil {
		return errors.Join(&ServiceError{Code: 0, Description: description}, fmt.Errorf("error code %q is not a number", codeText))
	}
	return &ServiceError{Code: code, Description: description}
}

// Compose asks the compose verb for a node's composition, or returns a
// *ServiceError for a request the service refused.
func (c *Client) Compose(ctx context.Context, req *provisionerv1.ComposeRequest) (*provisionerv1.ComposeResponse, error) {
	answer := &provisionerv1.ComposeResponse{}
	if err := c.call(ctx, c.composeSubject, req, answer); err != nil {
		return nil, err
	}
	return answer, nil
}

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
	nc      *nats.Conn
	subject string
}

// Option configures a Client.
type Option func(*Client)

// WithSubject sets the verb's subject, for a service behind a subject
// mapping or an account import.
func WithSubject(subject string) Option {
	return func(c *Client) { c.subject = subject }
}

// New returns a client on nc.
func New(nc *nats.Conn, opts ...Option) *Client {
	c := &Client{nc: nc, subject: service.ProvisioningSubject}
	for _, opt := range opts {
		opt(c)
	}
	return c
}

// Subject returns the subject the client asks.
func (c *Client) Subject() string { return c.subject }

// Provisioning asks the verb and returns its answer, or a *ServiceError for
// an answer the service refused, or a transport error (such as
// nats.ErrNoResponders when no instance runs). ctx bounds the wait; give it
// a deadline.
func (c *Client) Provisioning(ctx context.Context, req *provisionerv1.ProvisioningRequest) (*provisionerv1.ProvisioningResponse, error) {
	data, err := proto.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("encode request: %w", err)
	}
	msg := nats.NewMsg(c.subject)
	msg.Data = data
	msg.Header.Set("Content-Type", service.ContentTypeProtobuf)
	reply, err := c.nc.RequestMsgWithContext(ctx, msg)
	if err != nil {
		return nil, err
	}
	if err := ErrorOf(reply); err != nil {
		return nil, err
	}
	answer := &provisionerv1.ProvisioningResponse{}
	if err := proto.Unmarshal(reply.Data, answer); err != nil {
		return nil, fmt.Errorf("decode answer: %w", err)
	}
	return answer, nil
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

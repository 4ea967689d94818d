package wire

import "github.com/nats-io/nats.go/micro"

// Names under which the service is found on the bus.
const (
	// ServiceName is the micro service's name, as discovery ($SRV.*) shows it.
	ServiceName = "mesh-provisioner"
	// ProvisioningEndpoint is the name of the endpoint that reads a bucket.
	ProvisioningEndpoint = "provisioning"
	// ProvisioningSubject is the subject ProvisioningEndpoint answers.
	ProvisioningSubject = ServiceName + "." + ProvisioningEndpoint
	// ComposeEndpoint is the name of the endpoint that composes a node.
	ComposeEndpoint = "compose"
	// ComposeSubject is the subject ComposeEndpoint answers.
	ComposeSubject = ServiceName + "." + ComposeEndpoint
)

// Content types of requests and answers, in the Content-Type header.
const (
	ContentTypeProtobuf = "application/protobuf"
	ContentTypeJSON     = "application/json"
)

// Headers of an error answer, as the NATS service API names them.
const (
	ErrorHeader     = micro.ErrorHeader
	ErrorCodeHeader = micro.ErrorCodeHeader
)

// StreamOf returns the name of the JetStream stream that holds a KV bucket.
func StreamOf(bucket string) string { return "KV_" + bucket }

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

// SeatSubject is where the provisioner seat's lease is kept: a subject of the
// registry bucket's stream outside its keys ($KV.<bucket>.>), so that KV
// watchers of the registry never see it, and so that every registry write can
// be made conditional on the lease's sequence in the same stream.
const SeatSubject = "$SEAT." + ServiceName

// RunsAsAPIPrefix is where a mesh account reaches the provisioner account's
// JetStream when the server runs in an account of its own: the mesh account
// imports the state buckets' stream information and key subjects under it
// (permissions.RunsAs), and a node's client binds its buckets through it
// (nodeclient.Config.APIPrefix). A put of key K of bucket B is then published
// to "$PROVISIONER.API.$KV.B.K".
const RunsAsAPIPrefix = "$PROVISIONER.API"

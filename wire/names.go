package wire

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"

	"github.com/nats-io/nats.go/micro"
)

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

	// The node-addressed endpoints answer the same verbs for one node, named
	// by the subject's last token (NodeSubject), so that nats-server confines
	// a node to its own subject: mesh-provisioner.provisioning.<node> and
	// mesh-provisioner.compose.<node>.
	ProvisioningNodeEndpoint = ProvisioningEndpoint + "-node"
	ComposeNodeEndpoint      = ComposeEndpoint + "-node"

	// ProvisionsEndpoint answers what one provider must provision across the
	// mesh, on mesh-provisioner.provisions.<provider> (ProviderSubject).
	ProvisionsEndpoint = "provisions"
	// ProvisionsSubject is the verb's subject before the provider's token.
	ProvisionsSubject = ServiceName + "." + ProvisionsEndpoint
)

// The write verbs: a node's records, a provider's bucket and the manifests
// are written only through them, the asker named by the subject's tokens
// after the verb (docs/protocol.md, "Writing").
const (
	// PutEndpoint writes one record: mesh-provisioner.put.<node>.
	PutEndpoint = "put"
	PutSubject  = ServiceName + "." + PutEndpoint
	// DeleteEndpoint deletes one record: mesh-provisioner.delete.<node>.
	DeleteEndpoint = "delete"
	DeleteSubject  = ServiceName + "." + DeleteEndpoint
	// ApplyEndpoint replaces a module's needs: mesh-provisioner.apply.<node>.
	ApplyEndpoint = "apply"
	ApplySubject  = ServiceName + "." + ApplyEndpoint
	// DeclareEndpoint declares a provider's manifest from a node that runs
	// it: mesh-provisioner.declare.<node>.<provider> (DeclareSubjectOf).
	DeclareEndpoint = "declare"
	DeclareSubject  = ServiceName + "." + DeclareEndpoint
	// BindEndpoint writes a provider's bucket: mesh-provisioner.bind.<provider>.
	BindEndpoint = "bind"
	BindSubject  = ServiceName + "." + BindEndpoint
)

// DeclareSubjectOf returns the subject on which node declares provider's
// manifest: "mesh-provisioner.declare.<node>.<provider>". Only a node whose
// permissions name the provider may publish there.
func DeclareSubjectOf(node, provider string) string {
	return DeclareSubject + "." + node + "." + provider
}

// NodeSubject returns a verb's node-addressed subject: NodeSubject(ComposeSubject,
// "ace") is "mesh-provisioner.compose.ace". A node's permissions grant its own.
func NodeSubject(verbSubject, node string) string { return verbSubject + "." + node }

// ProviderSubject returns the provisions verb's subject of a provider:
// "mesh-provisioner.provisions.<provider>".
func ProviderSubject(provider string) string { return ProvisionsSubject + "." + provider }

// MaxNameLen is the most bytes a node, module, provider, collection or
// contributor named in a request may take: more than any key token of a
// real mesh, and few enough that a request cannot make its answer large by
// its names alone.
const MaxNameLen = 256

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

// BoundSuffix ends the name of every provider's bucket.
const BoundSuffix = "_bound"

// BoundBucket returns the name of a provider's bucket, <provider>_bound,
// where it writes what it has provisioned (the registry's "bound" entry).
func BoundBucket(provider string) string { return provider + BoundSuffix }

// StreamOf returns the name of the JetStream stream that holds a KV bucket.
func StreamOf(bucket string) string { return "KV_" + bucket }

// KVSubject returns the subject of key in a KV bucket, "$KV.<bucket>.<key>":
// a put or delete of the key is a publish there. key may end in a wildcard
// (">" for every key).
func KVSubject(bucket, key string) string { return KVPrefix(bucket) + key }

// KVPrefix returns what every key subject of a KV bucket starts with:
// "$KV.<bucket>.".
func KVPrefix(bucket string) string { return KVRoot + "." + bucket + "." }

// KVRoot is the first token of every KV key subject, of any bucket.
const KVRoot = "$KV"

// SeatSubject is where the provisioner seat's lease is kept: a subject of the
// registry bucket's stream outside its keys ($KV.<bucket>.>), so that KV
// watchers of the registry never see it, and so that every registry write can
// be made conditional on the lease's sequence in the same stream.
const SeatSubject = "$SEAT." + ServiceName

// PartitionSeatSubjects are where the seats of a partitioned mesh's
// partitions are kept, beside SeatSubject in the same stream: the holder
// of a partition's seat writes the plans of its nodes (serve --hold).
const PartitionSeatSubjects = SeatSubject + ".>"

// PartitionSeatSubject returns where the seat of partition p is kept.
func PartitionSeatSubject(p int) string { return SeatSubject + "." + strconv.Itoa(p) }

// RunsAsAPIPrefix is where a node's account imports its plan key's subject
// when the server runs in an account of its own (permissions.RunsAs): the
// node hears its plan change on "$PROVISIONER.API.$KV.mesh-provisioner_plans.<node>"
// (client.WithAPIPrefix). Nothing else of the server's JetStream is
// imported.
const RunsAsAPIPrefix = "$PROVISIONER.API"

// ManifestDigest returns the digest of a provider's manifest as stored in
// the manifests bucket: "sha256:" and the hex SHA-256 of its bytes.
func ManifestDigest(value []byte) string {
	sum := sha256.Sum256(value)
	return "sha256:" + hex.EncodeToString(sum[:])
}

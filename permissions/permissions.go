package permissions

import (
	"fmt"
	"slices"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// nodeVerbs are a node's own subjects of the service's verbs: all it may
// ask, so that nats-server confines it to its own records and plan. It
// writes through the write verbs alone, and declares the manifests of the
// providers it runs.
func nodeVerbs(node string, providers []string) []string {
	out := []string{
		wire.NodeSubject(wire.ProvisioningSubject, node), wire.NodeSubject(wire.ComposeSubject, node),
		wire.NodeSubject(wire.PutSubject, node), wire.NodeSubject(wire.DeleteSubject, node), wire.NodeSubject(wire.ApplySubject, node),
	}
	for _, provider := range providers {
		out = append(out, wire.DeclareSubjectOf(node, provider))
	}
	return out
}

// writeVerbs are the subjects of every write verb, of every node and
// provider: an operator, who writes nothing, is denied them.
func writeVerbs() []string {
	return []string{wire.PutSubject + ".>", wire.DeleteSubject + ".>", wire.ApplySubject + ".>", wire.DeclareSubject + ".>", wire.BindSubject + ".>"}
}

// intoStreams are the subjects through which an identity could publish
// into JetStream, or have its answers aimed: denied outright to nodes and
// providers, so that no later allow can grant them. JetStream answers a
// publish or an API request on whatever reply subject its publisher chose,
// and a stream that captures that subject stores the answer: only the
// service's writer publishes there (docs/security.md).
var intoStreams = []string{"$JS.>", wire.KVRoot + ".>", wire.SeatSubject, wire.PartitionSeatSubjects}

// Permissions are the publish and subscribe rules of one identity, in the
// shape of a nats-server permissions block.
type Permissions struct {
	Publish   Rule `json:"publish"`
	Subscribe Rule `json:"subscribe"`
	// No identity of the mesh has allow_responses: nats-server honours it
	// over any deny, so an identity that has it publishes wherever a
	// request's reply subject points.
}

// Rule lists the subjects allowed and denied. A denial wins over an allow.
type Rule struct {
	Allow []string `json:"allow,omitempty"`
	Deny  []string `json:"deny,omitempty"`
}

// jsAPI returns a JetStream API subject.
func jsAPI(verb, stream string) string { return "$JS.API." + verb + "." + stream }

// kvSubjects returns the subjects of a bucket's keys under prefix: "" for all.
func kvSubjects(bucket, prefix string) string {
	if prefix == "" {
		return wire.KVSubject(bucket, ">")
	}
	return wire.KVSubject(bucket, prefix+".>")
}

// adminDenied are the JetStream API subjects that change or remove streams
// and consumers, or read every message of a stream by sequence. Nodes and
// providers are denied them outright, so that no later allow can grant them.
var adminDenied = []string{
	"$JS.API.STREAM.CREATE.>",
	"$JS.API.STREAM.UPDATE.>",
	"$JS.API.STREAM.DELETE.>",
	"$JS.API.STREAM.PURGE.>",
	"$JS.API.STREAM.MSG.DELETE.>",
	"$JS.API.STREAM.RESTORE.>",
	"$JS.API.CONSUMER.DELETE.>",
	"$JS.API.CONSUMER.DURABLE.CREATE.>",
}

// Node returns the permissions of node's provisioner client, which runs
// the providers given:
//
//   - publish mesh-provisioner.provisioning.<node> and
//     mesh-provisioner.compose.<node>: ask both read verbs on its own
//     subjects, where the service answers its own records and plan and the
//     registry, nothing of any other node;
//   - publish mesh-provisioner.put.<node>, .delete.<node> and
//     .apply.<node>: write its own records through the service, which
//     checks that each key is the node's;
//   - publish mesh-provisioner.declare.<node>.<provider> for each provider
//     it runs: declare that provider's manifest, which no other node may;
//   - subscribe $KV.mesh-provisioner_plans.<node>: hear its plan change
//     (client.WatchPlan), which it then composes;
//   - subscribe _INBOX_MESH.node.<node>.>: the answers to its requests.
//
// It publishes nothing into JetStream ($JS.>, $KV.> and the seat are
// denied): JetStream answers on the reply subject its publisher chooses,
// so a grant to publish there would let a node aim a stored answer at any
// other node's key.
func Node(node string, providers ...string) (Permissions, error) {
	return nodePermissions(node, "", providers)
}

// NodeRunsAs returns the permissions of node's provisioner client in the mesh
// account when the server runs in an account of its own (RunsAs): those of
// Node, its plan's key subscribed under wire.RunsAsAPIPrefix, where the mesh
// account imports the plans' writes.
func NodeRunsAs(node string, providers ...string) (Permissions, error) {
	return nodePermissions(node, wire.RunsAsAPIPrefix, providers)
}

// nodePermissions are Node's, the plan's key heard under apiPrefix (empty:
// in the node's own account).
func nodePermissions(node, apiPrefix string, providers []string) (Permissions, error) {
	if _, err := keys.NodeFilter(node); err != nil {
		return Permissions{}, fmt.Errorf("permissions for node: %w", err)
	}
	for _, provider := range providers {
		if err := keys.CheckToken(provider); err != nil {
			return Permissions{}, fmt.Errorf("permissions for node %s: provider %q %w", node, provider, err)
		}
	}
	var p Permissions
	p.Publish.Allow = nodeVerbs(node, providers)
	p.Publish.Deny = slices.Clone(intoStreams)
	if apiPrefix != "" {
		p.Publish.Deny = append(p.Publish.Deny, apiPrefix+".>")
	}
	plan := wire.KVSubject(keys.PlansBucket, node)
	if apiPrefix != "" {
		plan = apiPrefix + "." + plan
	}
	p.Subscribe.Allow = []string{wire.InboxPrefix(wire.RoleNode, node) + ".>", plan}
	return p, nil
}

// Provider returns the permissions of a provider module that provisions
// what nodes' bound needs ask of it, in its bucket <module>_bound:
//
//   - publish mesh-provisioner.provisions.<module>: ask what it must
//     provision across the mesh, which is all it needs of the nodes' needs;
//   - publish mesh-provisioner.bind.<module>: write or remove a key of its
//     bucket through the service, which follows the keys' revisions and
//     keeps no value;
//   - subscribe _INBOX_MESH.provider.<module>.>: its replies.
//
// It reads no provisioning bucket and asks no other verb: a node's needs,
// plan and records are not a provider's to read beyond what is asked of it.
// It publishes nothing into JetStream ($JS.>, $KV.> and the seat are
// denied), where its answers could be aimed at any key.
func Provider(module string) (Permissions, error) {
	if err := keys.CheckToken(module); err != nil {
		return Permissions{}, fmt.Errorf("permissions for provider: module %q %w", module, err)
	}
	var p Permissions
	p.Publish.Allow = []string{wire.ProviderSubject(module), wire.BindSubject + "." + module}
	p.Publish.Deny = slices.Clone(intoStreams)
	p.Subscribe.Allow = []string{wire.InboxPrefix(wire.RoleProvider, module) + ".>"}
	return p, nil
}

// Operator returns the permissions of an operator's identity named name,
// which reads the whole mesh and writes nothing: what status, query of any
// node and capture need.
//
//   - publish mesh-provisioner.> (every verb, of every node and provider)
//     and $SRV.> (micro discovery: the instances and their stats);
//   - for each of the five buckets, publish $JS.API.STREAM.INFO of its
//     stream, $JS.API.STREAM.MSG.GET and $JS.API.DIRECT.GET (its last write),
//     and $JS.API.CONSUMER.CREATE.<stream>.> with $JS.FC.<stream>.> and
//     $JS.API.CONSUMER.DELETE.<stream>.> (capture reads a bucket whole
//     through an ordered consumer, and removes it after);
//   - for each provider given, the same reads of its bucket's stream
//     KV_<provider>_bound but for the last message: capture reads the
//     keys the provider has bound (headers only);
//   - subscribe _INBOX_MESH.operator.<name>.>: its replies.
//
// It is denied every bucket's keys, the write verbs (it writes nothing,
// of any node or provider), the seat and every other administration
// subject. Deleting consumers writes no data; it could
// delete a server's watcher, which the server notices within a second and
// makes again (docs/security.md).
func Operator(name string, providers ...string) (Permissions, error) {
	if err := keys.CheckToken(name); err != nil {
		return Permissions{}, fmt.Errorf("permissions for operator: name %q %w", name, err)
	}
	var p Permissions
	p.Publish.Allow = []string{wire.ServiceName + ".>", "$SRV.>"}
	for _, bucket := range append(keys.Buckets(), keys.PlansBucket) {
		stream := wire.StreamOf(bucket)
		p.Publish.Allow = append(p.Publish.Allow,
			jsAPI("STREAM.INFO", stream),
			jsAPI("STREAM.MSG.GET", stream),
			jsAPI("DIRECT.GET", stream),
			jsAPI("DIRECT.GET", stream)+".>",
			jsAPI("CONSUMER.CREATE", stream)+".>",
			jsAPI("CONSUMER.DELETE", stream)+".>",
			"$JS.FC."+stream+".>",
		)
	}
	bound, err := followBound("operator", providers)
	if err != nil {
		return Permissions{}, err
	}
	p.Publish.Allow = append(p.Publish.Allow, bound...)
	for _, bucket := range append(keys.Buckets(), keys.PlansBucket) {
		p.Publish.Deny = append(p.Publish.Deny, kvSubjects(bucket, ""))
	}
	p.Publish.Deny = append(p.Publish.Deny, wire.SeatSubject, wire.PartitionSeatSubjects)
	p.Publish.Deny = append(p.Publish.Deny, writeVerbs()...)
	p.Publish.Deny = append(p.Publish.Deny, slices.DeleteFunc(slices.Clone(adminDenied), func(s string) bool { return s == "$JS.API.CONSUMER.DELETE.>" })...)
	p.Subscribe.Allow = []string{wire.InboxPrefix(wire.RoleOperator, name) + ".>"}
	return p, nil
}

// Server returns the permissions of the server's answering identity
// (wire.ServerIdentity), the connection that answers the verbs:
//
//   - subscribe mesh-provisioner.> (its verbs) and $SRV.> (micro discovery);
//   - publish only to the inboxes it answers to (wire.ReplyPrefixes, each
//     as "<prefix>>"): the answers;
//   - publish $SRV.INFO.mesh-provisioner, and publish and subscribe its own
//     inbox _INBOX_MESH.server.mesh-provisioner.>: at start an instance
//     asks discovery whether others serve (service.Start), and instances
//     answer each other there;
//   - publish mesh-provisioner.partition.>: an instance that serves some
//     partitions (serve --hold) hands a request about another's nodes to
//     its holder there (wire.RelaySubject), reply subject and all.
//
// It has no allow_responses, which nats-server honours over any deny, so an
// answer aimed at anything but an inbox is refused by nats-server whatever
// the service does; and it is denied, so that no later allow can grant
// them, JetStream's and KV's subjects, the seat, system subjects and the
// writer's inbox, where its writer's replies arrive. It writes nothing:
// ServerWriter does.
func Server() Permissions {
	var p Permissions
	for _, prefix := range wire.ReplyPrefixes() {
		p.Publish.Allow = append(p.Publish.Allow, prefix+">")
	}
	own := wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity) + ".>"
	// At start an instance asks discovery whether others serve; their
	// answers come to its own inbox.
	p.Publish.Allow = append(p.Publish.Allow, "$SRV.INFO."+wire.ServiceName, own, wire.RelayRoot+".>")
	p.Publish.Deny = []string{"$JS.>", wire.KVRoot + ".>", wire.SeatSubject, wire.PartitionSeatSubjects, "$SYS.>", wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".>"}
	p.Subscribe.Allow = []string{wire.ServiceName + ".>", "$SRV.>", own}
	return p
}

// followBound returns the subjects that follow the keys of each provider's
// bucket through an ordered consumer of headers only: its stream's
// information, the consumer made, pulled from (the server's) or
// flow-controlled (capture's push consumer), and removed.
func followBound(who string, providers []string) ([]string, error) {
	var subjects []string
	for _, provider := range providers {
		if err := keys.CheckToken(provider); err != nil {
			return nil, fmt.Errorf("permissions for %s: provider %q %w", who, provider, err)
		}
		stream := wire.StreamOf(wire.BoundBucket(provider))
		subjects = append(subjects,
			jsAPI("STREAM.INFO", stream),
			jsAPI("CONSUMER.CREATE", stream),
			jsAPI("CONSUMER.CREATE", stream)+".>",
			jsAPI("CONSUMER.MSG.NEXT", stream)+".>",
			jsAPI("CONSUMER.DELETE", stream)+".>",
			"$JS.FC."+stream+".>",
		)
	}
	return subjects, nil
}

// ServerWriter returns the permissions of the server's writing identity
// (wire.WriterIdentity), the connection that keeps the buckets, for a mesh
// whose providers are those given:
//
//   - publish $KV.mesh-provisioner_registry.>: write the registry;
//   - publish $KV.<state bucket>.> of the four state buckets: store the
//     nodes' writes that the write verbs checked (put, delete, apply,
//     declare), the only way they reach a bucket;
//   - publish $KV.mesh-provisioner_plans.>, and the direct and message gets
//     of its stream: keep each node's plan digest (service.RunPlans);
//   - publish $SEAT.mesh-provisioner and
//     $JS.API.DIRECT.GET.KV_mesh-provisioner_registry.$SEAT.mesh-provisioner:
//     take, renew, hand back and read the provisioner seat (package seat);
//     the same of $SEAT.mesh-provisioner.>, the partitions' seats (serve
//     --hold);
//   - publish $JS.API.INFO: the KV client reads the account's JetStream
//     information before it creates a bucket;
//   - for each of the five buckets and the plans', publish $JS.API.STREAM.INFO, .CREATE and
//     .UPDATE of its stream (create a missing bucket, refuse rollups and
//     purges on the state buckets), and $JS.API.CONSUMER.CREATE.<stream>.>
//     with $JS.FC.<stream>.> and $JS.API.CONSUMER.DELETE.<stream>.> (watch
//     it, and remove its watcher's consumer when it stops);
//   - for each of the five buckets, publish
//     $JS.API.CONSUMER.MSG.NEXT.<stream>.> (pull from the consumer that
//     keeps its copy) and $JS.API.DIRECT.GET.<stream> (read the changes
//     after its copy's revision while that consumer is being made again,
//     an asking node's keys while the copy loads, and the registry's and
//     the manifests' keys as the copy first reads them);
//   - for each provider given, its bucket's stream KV_<provider>_bound:
//     publish $JS.API.STREAM.INFO, $JS.API.CONSUMER.CREATE.<stream> (and
//     .>), $JS.API.CONSUMER.MSG.NEXT.<stream>.>,
//     $JS.API.CONSUMER.DELETE.<stream>.> and $JS.FC.<stream>.>: follow
//     the keys it has bound (the server asks for headers only, never a
//     provider's values), which compositions report as bound or pending;
//     and publish $KV.<provider>_bound.> and $JS.API.STREAM.CREATE of its
//     stream: store what the provider binds (the bind verb), making the
//     bucket on its first bind;
//   - subscribe _INBOX_MESH.server.mesh-provisioner-writer.>: its replies.
//
// It subscribes to nothing a node can publish to (the verbs and discovery
// are denied outright), answers no request (no allow_responses), publishes
// with its own inbox as every reply subject, and is denied stream deletion
// and purge. A provider not given has its provisions read as
// pending, and compositions say its bucket is behind.
func ServerWriter(providers ...string) (Permissions, error) {
	var p Permissions
	registry := wire.StreamOf(keys.RegistryBucket)
	plans := wire.StreamOf(keys.PlansBucket)
	p.Publish.Allow = []string{kvSubjects(keys.RegistryBucket, ""), wire.SeatSubject,
		jsAPI("DIRECT.GET", registry) + "." + wire.SeatSubject, wire.PartitionSeatSubjects,
		jsAPI("DIRECT.GET", registry) + "." + wire.PartitionSeatSubjects, "$JS.API.INFO",
		kvSubjects(keys.PlansBucket, ""), jsAPI("DIRECT.GET", plans) + ".>", jsAPI("STREAM.MSG.GET", plans)}
	for _, bucket := range append(keys.Buckets(), keys.PlansBucket) {
		stream := wire.StreamOf(bucket)
		p.Publish.Allow = append(p.Publish.Allow,
			jsAPI("STREAM.INFO", stream),
			jsAPI("STREAM.CREATE", stream),
			jsAPI("STREAM.UPDATE", stream),
			jsAPI("CONSUMER.CREATE", stream)+".>",
			jsAPI("CONSUMER.DELETE", stream)+".>",
			"$JS.FC."+stream+".>",
			jsAPI("CONSUMER.MSG.NEXT", stream)+".>",
			jsAPI("DIRECT.GET", stream),
		)
	}
	bound, err := followBound("the server's writer", providers)
	if err != nil {
		return Permissions{}, err
	}
	p.Publish.Allow = append(p.Publish.Allow, bound...)
	for _, bucket := range keys.StateBuckets() {
		p.Publish.Allow = append(p.Publish.Allow, kvSubjects(bucket, ""))
	}
	for _, provider := range providers {
		bucket := wire.BoundBucket(provider)
		p.Publish.Allow = append(p.Publish.Allow, kvSubjects(bucket, ""), jsAPI("STREAM.CREATE", wire.StreamOf(bucket)))
	}
	p.Publish.Deny = append(p.Publish.Deny, jsAPI("STREAM.DELETE", ">"), jsAPI("STREAM.PURGE", ">"))
	p.Subscribe.Allow = []string{wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".>"}
	p.Subscribe.Deny = []string{wire.ServiceName + ".>", "$SRV.>"}
	return p, nil
}

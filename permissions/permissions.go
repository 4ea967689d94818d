package permissions

import (
	"fmt"
	"slices"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// nodeVerbs are a node's own subjects of the service's verbs: all it may
// ask, so that nats-server confines it to its own records and plan.
func nodeVerbs(node string) []string {
	return []string{wire.NodeSubject(wire.ProvisioningSubject, node), wire.NodeSubject(wire.ComposeSubject, node)}
}

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

// Node returns the permissions of node's provisioner client:
//
//   - publish $KV.<state bucket>.<node>.> on each of the four state buckets:
//     put and delete its own keys;
//   - publish $JS.API.STREAM.INFO.KV_<state bucket>: binding a bucket (the KV
//     client reads its stream's configuration);
//   - publish mesh-provisioner.provisioning.<node> and
//     mesh-provisioner.compose.<node>: ask both verbs on its own subjects,
//     where the service answers its own records and plan and the registry,
//     nothing of any other node;
//   - subscribe $KV.mesh-provisioner_plans.<node>, and publish the direct
//     get of that key alone (watchOwnPlan): learn that its plan changed
//     without asking;
//   - subscribe _INBOX_MESH.node.<node>.>: the acknowledgements of its
//     writes and the answers to its requests.
//
// It is denied the registry's subjects and the seat's, every other node's keys (by not being
// allowed them), every stream administration subject, consumer deletion,
// and every consumer of the provisioning buckets and the plans bucket: a
// consumer it may make is one more it may make, until the stream's limit.
func Node(node string) (Permissions, error) {
	return nodePermissions(node, "")
}

// NodeRunsAs returns the permissions of node's provisioner client in the mesh
// account when the server runs in an account of its own (RunsAs): those of
// Node, with the state buckets' key and stream information subjects, and
// the subjects of its plan's watch, under wire.RunsAsAPIPrefix, where the
// mesh account imports the provisioner account's. Its client binds the
// buckets with nodeclient.Config.APIPrefix, and watches its plan with
// client.WithAPIPrefix.
func NodeRunsAs(node string) (Permissions, error) {
	return nodePermissions(node, wire.RunsAsAPIPrefix)
}

// nodePermissions are Node's, the state buckets reached under apiPrefix
// (empty: in the node's own account).
func nodePermissions(node, apiPrefix string) (Permissions, error) {
	if _, err := keys.NodeFilter(node); err != nil {
		return Permissions{}, fmt.Errorf("permissions for node: %w", err)
	}
	under, api := underPrefix(apiPrefix)
	var p Permissions
	for _, bucket := range keys.StateBuckets() {
		p.Publish.Allow = append(p.Publish.Allow, under(kvSubjects(bucket, node)))
	}
	for _, bucket := range keys.StateBuckets() {
		p.Publish.Allow = append(p.Publish.Allow, api("STREAM.INFO", wire.StreamOf(bucket)))
	}
	p.Publish.Allow = append(p.Publish.Allow, nodeVerbs(node)...)
	p.Subscribe.Allow = []string{wire.InboxPrefix(wire.RoleNode, node) + ".>"}
	publish, subscribe := watchOwnPlan(node, apiPrefix)
	p.Publish.Allow = append(p.Publish.Allow, publish...)
	p.Subscribe.Allow = append(p.Subscribe.Allow, subscribe)
	// Only the seat's holder writes the registry and the plan digests.
	p.Publish.Deny = []string{kvSubjects(keys.RegistryBucket, ""), kvSubjects(keys.PlansBucket, ""), wire.SeatSubject}
	if apiPrefix != "" {
		// Under the prefix too: a write there would reach no stream, but a
		// message on another node's plan key would reach its watch.
		p.Publish.Deny = append(p.Publish.Deny, under(kvSubjects(keys.RegistryBucket, "")), under(kvSubjects(keys.PlansBucket, "")))
	}
	p.Publish.Deny = append(p.Publish.Deny, adminDenied...)
	// No consumer of any bucket, whatever is allowed later: a state
	// bucket's reads every node's keys, and a node that may make one of
	// the plans' may make them until the stream holds no more, and every
	// node's watch fails. Nor the direct get whose body names the key.
	for _, bucket := range append(keys.Buckets(), keys.PlansBucket) {
		p.Publish.Deny = append(p.Publish.Deny, api("CONSUMER.CREATE", wire.StreamOf(bucket))+".>")
	}
	p.Publish.Deny = append(p.Publish.Deny, api("DIRECT.GET", wire.StreamOf(keys.PlansBucket)))
	return p, nil
}

// underPrefix returns how a node reaches the provisioner's JetStream: a
// bucket's key subjects (under) and its API subjects (api), in its own
// account when apiPrefix is empty, else under apiPrefix, where the mesh
// account imports them (RunsAs).
func underPrefix(apiPrefix string) (under func(subject string) string, api func(op, stream string) string) {
	if apiPrefix == "" {
		return func(subject string) string { return subject }, jsAPI
	}
	return func(subject string) string { return apiPrefix + "." + subject },
		func(op, stream string) string { return apiPrefix + "." + op + "." + stream }
}

// watchOwnPlan returns the subjects through which node watches its own key
// of the plans bucket (client.WatchPlan), under apiPrefix if set: to
// publish, the stream's information (binding the bucket) and the direct
// get of the last message on $KV.mesh-provisioner_plans.<node> (nats-server
// reads the key from the subject, and refuses a body that names another);
// to subscribe, that subject, on which every write of the key is
// published. No consumer: one a node may make is one more it may make.
func watchOwnPlan(node, apiPrefix string) (publish []string, subscribe string) {
	under, api := underPrefix(apiPrefix)
	stream := wire.StreamOf(keys.PlansBucket)
	key := wire.KVSubject(keys.PlansBucket, node)
	return []string{api("STREAM.INFO", stream), api("DIRECT.GET", stream) + "." + key}, under(key)
}

// Provider returns the permissions of a provider module that provisions
// what nodes' bound needs ask of it and keeps its own bucket
// <module>_bound:
//
//   - publish mesh-provisioner.provisions.<module>: ask what it must
//     provision across the mesh, which is all it needs of the nodes' needs;
//   - publish $KV.<module>_bound.> and $JS.API.STREAM.INFO.KV_<module>_bound:
//     write its own bucket;
//   - subscribe _INBOX_MESH.provider.<module>.>: its replies.
//
// It reads no provisioning bucket and asks no other verb: a node's needs,
// plan and records are not a provider's to read beyond what is asked of it.
// It is denied every provisioning bucket's keys and every stream and
// consumer administration subject.
func Provider(module string) (Permissions, error) {
	if err := keys.CheckToken(module); err != nil {
		return Permissions{}, fmt.Errorf("permissions for provider: module %q %w", module, err)
	}
	bound := wire.BoundBucket(module)
	var p Permissions
	p.Publish.Allow = []string{
		wire.ProviderSubject(module),
		kvSubjects(bound, ""),
		jsAPI("STREAM.INFO", wire.StreamOf(bound)),
	}
	for _, bucket := range keys.Buckets() {
		p.Publish.Deny = append(p.Publish.Deny, kvSubjects(bucket, ""))
	}
	p.Publish.Deny = append(p.Publish.Deny, wire.SeatSubject)
	p.Publish.Deny = append(p.Publish.Deny, adminDenied...)
	p.Publish.Deny = append(p.Publish.Deny, "$JS.API.CONSUMER.CREATE.>")
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
// It is denied every bucket's keys, the seat and every other
// administration subject. Deleting consumers writes no data; it could
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
	p.Publish.Deny = append(p.Publish.Deny, wire.SeatSubject)
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
//     answer each other there.
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
	p.Publish.Allow = append(p.Publish.Allow, "$SRV.INFO."+wire.ServiceName, own)
	p.Publish.Deny = []string{"$JS.>", wire.KVRoot + ".>", wire.SeatSubject, "$SYS.>", wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".>"}
	p.Subscribe.Allow = []string{wire.ServiceName + ".>", "$SRV.>", own}
	return p
}

// followBound returns the subjects that follow the keys of each provider's
// bucket through a KV watcher: its stream's information, an ordered
// consumer (made, flow-controlled, removed).
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
//   - publish $KV.mesh-provisioner_plans.>, and the direct and message gets
//     of its stream: keep each node's plan digest (service.RunPlans);
//   - publish $SEAT.mesh-provisioner and
//     $JS.API.DIRECT.GET.KV_mesh-provisioner_registry.$SEAT.mesh-provisioner:
//     take, renew, hand back and read the provisioner seat (package seat);
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
//     after its copy's revision while that consumer is being made again);
//   - for each provider given, its bucket's stream KV_<provider>_bound:
//     publish $JS.API.STREAM.INFO, $JS.API.CONSUMER.CREATE.<stream> (and
//     .>), $JS.API.CONSUMER.DELETE.<stream>.> and $JS.FC.<stream>.>: follow
//     the keys it has bound (the server asks for headers only, never a
//     provider's values), which compositions report as bound or pending;
//   - subscribe _INBOX_MESH.server.mesh-provisioner-writer.>: its replies.
//
// It subscribes to nothing a node can publish to (the verbs and discovery
// are denied outright), answers no request (no allow_responses), and is
// denied the state buckets' keys, which it reads and never writes, and
// stream deletion and purge. A provider not given has its provisions read as
// pending, and compositions say its bucket is behind.
func ServerWriter(providers ...string) (Permissions, error) {
	var p Permissions
	registry := wire.StreamOf(keys.RegistryBucket)
	plans := wire.StreamOf(keys.PlansBucket)
	p.Publish.Allow = []string{kvSubjects(keys.RegistryBucket, ""), wire.SeatSubject,
		jsAPI("DIRECT.GET", registry) + "." + wire.SeatSubject, "$JS.API.INFO",
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
		p.Publish.Deny = append(p.Publish.Deny, kvSubjects(bucket, ""))
	}
	p.Publish.Deny = append(p.Publish.Deny, jsAPI("STREAM.DELETE", ">"), jsAPI("STREAM.PURGE", ">"))
	p.Subscribe.Allow = []string{wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".>"}
	p.Subscribe.Deny = []string{wire.ServiceName + ".>", "$SRV.>"}
	return p, nil
}

package keys

// The provisioning buckets. Only the mesh-provisioner server writes them:
// the registry itself, and each node's keys of the others as the node asks
// through the write verbs, which confine it to its own keys.
const (
	// RegistryBucket holds one registry entry per kind, keyed <kind>.
	RegistryBucket = "mesh-provisioner_registry"
	// NeedsBucket holds what modules need, keyed <node>.<module>.<kind>.<name>.
	NeedsBucket = "mesh-provisioner_needs"
	// AppliedBucket holds what is applied, keyed <node>.<module>.
	AppliedBucket = "mesh-provisioner_applied"
	// CollectBucket holds collection items, keyed
	// <node>.<collection>.<contributor> with the collection escaped.
	CollectBucket = "mesh-provisioner_collect"
	// ManifestsBucket holds what each provider offers, keyed
	// <node>.<provider> by the nodes that run it.
	ManifestsBucket = "mesh-provisioner_manifests"
	// PlansBucket holds each node's plan digest (PlanDigest), keyed <node>,
	// written by the seat's holder only; a node watches its own key. It is
	// not a provisioning bucket: no verb reads it.
	PlansBucket = "mesh-provisioner_plans"
)

// Buckets lists every provisioning bucket, the registry first.
func Buckets() []string {
	return []string{RegistryBucket, NeedsBucket, AppliedBucket, CollectBucket, ManifestsBucket}
}

// StateBuckets lists the buckets of nodes' records, each node's keys written
// through the write verbs as it asks.
func StateBuckets() []string {
	return []string{NeedsBucket, AppliedBucket, CollectBucket, ManifestsBucket}
}

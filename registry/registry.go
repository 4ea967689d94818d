package registry

import (
	"fmt"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/keyshape"
	"github.com/novox/mesh-provisioner/wire"
)

// Owners of the kinds the registry answers.
const (
	ownerConfig     = "mesh-config"
	ownerVault      = "mesh-vault"
	ownerController = "mesh-controller"
	ownerSelf       = wire.ServiceName
)

// Where the owners keep values that are not in this server's buckets.
const (
	configBucket      = "mesh-config_values"
	assignmentsBucket = "mesh-controller_assignments"
	boundBucket       = keyshape.ProviderOwner + wire.BoundSuffix
)

// Table returns the registry: which module answers each kind and where a
// client finds the values. Each call returns a fresh copy.
func Table() []*provisionerv1.RegistryEntry {
	collection := func(kind, template, description string) *provisionerv1.RegistryEntry {
		e := bucketEntry(kind, ownerSelf, keys.CollectBucket, "<node>.<collection>.<contributor>", description)
		e.GetBucket().Collection = template
		return e
	}
	placement := func(kind, description string) *provisionerv1.RegistryEntry {
		return bucketEntry(kind, ownerController, assignmentsBucket, "<node>.<module>", description)
	}
	return []*provisionerv1.RegistryEntry{
		bucketEntry("config", ownerConfig, configBucket, "<node>.<module>.<name>",
			"A configuration value of a module on a node, kept by the config domain."),
		verbEntry("secret", ownerVault, "mesh-vault.secret",
			"A secret, asked of the vault on request; a secret is never in a bucket."),
		bucketEntry("bound", keyshape.ProviderOwner, boundBucket, "<node>.<module>.<provision>[.<local>]",
			"What a provider module bound for a consumer module, in the provider's own bucket."),
		verbEntry("consumers", ownerVault, "mesh-vault.consumers",
			"A provider's consumers' credentials, asked of the vault by the provider machine's client."),
		collection("collected", "<name>", "The items of the collection the placeholder names (${collected:x} reads x)."),
		collection("shell", "<kind>:<name>", "Shell snippets, read as the collection of the same name (${shell:zsh:normal} reads shell:zsh:normal)."),
		collection("environment", "<kind>:<name>", "Environment assignments, read as the collection of the same name."),
		collection("contribution", "<kind>:<name>", "Contributions to another module, read as the collection of the same name."),
		placement("dir", "A directory placed for the module; the assignment carries the provisioner's plan."),
		placement("access", "Access granted to the module; the assignment carries the provisioner's plan."),
		placement("port", "A port placed for the module; the assignment carries the provisioner's plan."),
		placement("seat", "A seat the module holds; the assignment carries the provisioner's plan."),
		placement("machine", "The machine the module is placed on; the assignment carries the provisioner's plan."),
	}
}

func bucketEntry(kind, owner, bucket, keyShape, description string) *provisionerv1.RegistryEntry {
	return &provisionerv1.RegistryEntry{
		Kind:        kind,
		Owner:       owner,
		Description: description,
		Source: &provisionerv1.RegistryEntry_Bucket{Bucket: &provisionerv1.BucketSource{
			Bucket:   bucket,
			KeyShape: keyShape,
		}},
	}
}

func verbEntry(kind, seat, subject, description string) *provisionerv1.RegistryEntry {
	return &provisionerv1.RegistryEntry{
		Kind:        kind,
		Owner:       seat,
		Description: description,
		Source: &provisionerv1.RegistryEntry_Verb{Verb: &provisionerv1.VerbSource{
			Seat:    seat,
			Subject: subject,
		}},
	}
}

func init() {
	if err := Validate(Table()); err != nil {
		panic(fmt.Sprintf("registry: the compiled table is invalid: %v", err))
	}
}

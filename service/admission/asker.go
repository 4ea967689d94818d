package admission

import (
	"fmt"
	"strings"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// CheckName refuses a name a request gives that is longer than
// wire.MaxNameLen (keys.CheckLength: the sentence echoes its first
// keys.MaxEchoed characters only) or, if it is a key token, one that no key
// could hold. label names it in the sentence.
func CheckName(label, value string, token bool) *wire.Error {
	if err := keys.CheckLength(label, value); err != nil {
		return wire.NewError(wire.CodeBadRequest, err.Error())
	}
	if !token || value == "" {
		return nil
	}
	if err := keys.CheckToken(value); err != nil {
		return wire.Errorf(wire.CodeBadRequest, "%s %q can match no key: it %v", label, keys.Echo(value), err)
	}
	return nil
}

// CheckAddress refuses the name an addressed subject ends with, as CheckName
// would the same name in a body.
func CheckAddress(role wire.Role, name string) *wire.Error {
	if werr := CheckName("the subject's "+string(role), name, true); werr != nil {
		return werr
	}
	if name == "" {
		return wire.Errorf(wire.CodeBadRequest, "the subject names no %s", role)
	}
	return nil
}

// ConfineProvisioning refuses, on mesh-provisioner.provisioning.<node>, a
// request for another node's records, or for every node's: a node reads its
// own needs, applied records and collection items, and the registry, which
// is the mesh's.
func ConfineProvisioning(node string, what provisionerv1.What, in *provisionerv1.ProvisioningRequest) *wire.Error {
	if werr := CheckAddress(wire.RoleNode, node); werr != nil {
		return werr
	}
	if what == provisionerv1.What_WHAT_REGISTRY || in.GetNode() == node {
		return nil
	}
	return wire.Errorf(wire.CodeForbidden, "%s on %s: %s", what, wire.NodeSubject(wire.ProvisioningSubject, keys.Echo(node)), whoseRecords(node, in.GetNode()))
}

// ConfineCompose refuses, on mesh-provisioner.compose.<node>, the
// composition of another node.
func ConfineCompose(node string, in *provisionerv1.ComposeRequest) *wire.Error {
	if werr := CheckAddress(wire.RoleNode, node); werr != nil {
		return werr
	}
	if in.GetNode() == node {
		return nil
	}
	return wire.Errorf(wire.CodeForbidden, "compose on %s composes node %q only, and the request names node %q; ask %s as that node",
		wire.NodeSubject(wire.ComposeSubject, keys.Echo(node)), keys.Echo(node), keys.Echo(in.GetNode()), wire.NodeSubject(wire.ComposeSubject, "<node>"))
}

// whoseRecords is the sentence of a provisioning request for records that
// are not the addressed node's.
func whoseRecords(node, asked string) string {
	if asked == "" {
		return fmt.Sprintf("a node reads its own records only: set node to %q (every node's records are for operators, on %s)", keys.Echo(node), wire.ProvisioningSubject)
	}
	return fmt.Sprintf("node %q reads its own records only, and the request names node %q; ask %s as that node", keys.Echo(node), keys.Echo(asked), wire.NodeSubject(wire.ProvisioningSubject, "<node>"))
}

// ConfineProvisions refuses, on mesh-provisioner.provisions.<provider>,
// another provider's provisions.
func ConfineProvisions(provider string, in *provisionerv1.ProvisionsRequest) *wire.Error {
	if werr := CheckAddress(wire.RoleProvider, provider); werr != nil {
		return werr
	}
	if in.GetProvider() == provider {
		return nil
	}
	return wire.Errorf(wire.CodeForbidden, "%s lists provider %q's provisions only, and the request names provider %q; ask %s as that provider",
		wire.ProviderSubject(provider), provider, in.GetProvider(), wire.ProviderSubject("<provider>"))
}

// An Asker is whom an addressed subject names, and so who asks on it:
// its role and name.
type Asker struct {
	Role wire.Role
	Name string
}

// AskerToken is the token of subject after prefix and its dot.
func AskerToken(subject, prefix string) string {
	name := subject[min(len(prefix)+1, len(subject)):]
	if i := strings.IndexByte(name, '.'); i >= 0 {
		name = name[:i]
	}
	return name
}

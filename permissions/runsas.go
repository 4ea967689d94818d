package permissions

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Default account names of RunsAs.
const (
	DefaultServerAccount = "PROVISIONER"
	DefaultMeshAccount   = "MESH"
)

// RunsAs is a mesh whose server runs in an account of its own: the server's
// account owns every bucket, the providers' too, and alone publishes into
// them; the mesh account, where the nodes and providers are, imports from
// it exactly what their clients need:
//
//   - the verbs' addressed subjects (mesh-provisioner.compose.*,
//     mesh-provisioner.put.*, mesh-provisioner.declare.*.*,
//     mesh-provisioner.bind.*, ...), as services, which each user's
//     permissions narrow to its own name;
//   - the plans' key subjects $KV.mesh-provisioner_plans.*, as a stream
//     imported under wire.RunsAsAPIPrefix, which each node's permissions
//     narrow to its own key: a node hears its plan change there.
//
// Nothing of the server's account's JetStream can be reached from the mesh
// account: no request of a mesh user is answered by JetStream.
type RunsAs struct {
	// ServerAccount is the server's account; empty means "PROVISIONER".
	ServerAccount string
	// MeshAccount is the nodes' account; empty means "MESH".
	MeshAccount string
	// Nodes are the nodes whose users the mesh account holds.
	Nodes []string
	// Providers are the providers whose users the mesh account holds; the
	// server's writer follows and writes their buckets.
	Providers []string
	// Hosts names, by node, the providers whose manifests it declares.
	Hosts map[string][]string
}

// PasswordVariable is the variable that stands for a user's password in
// RunsAs.Config: nats-server reads it from the environment.
func PasswordVariable(user string) string {
	switch user {
	case wire.ServerIdentity:
		return "PROVISIONER_PASSWORD"
	case wire.WriterIdentity:
		return "PROVISIONER_WRITER_PASSWORD"
	}
	upper := strings.Map(func(r rune) rune {
		switch {
		case r >= 'a' && r <= 'z':
			return r - 'a' + 'A'
		case r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
			return r
		}
		return '_'
	}, user)
	return upper + "_PASSWORD"
}

// Config returns the nats-server "accounts" block of the mesh: both accounts
// with JetStream, their users and permissions, and the exports and imports
// between them.
func (r RunsAs) Config() (string, error) {
	server, mesh := r.ServerAccount, r.MeshAccount
	if server == "" {
		server = DefaultServerAccount
	}
	if mesh == "" {
		mesh = DefaultMeshAccount
	}
	if server == mesh {
		return "", fmt.Errorf("runs-as: the server's account and the mesh account are both %q", server)
	}
	var b strings.Builder
	q := strconv.Quote
	b.WriteString("accounts {\n")

	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users = [\n", q(server))
	writeUser(&b, wire.ServerIdentity, Server())
	writer, err := ServerWriter(r.Providers...)
	if err != nil {
		return "", err
	}
	writeUser(&b, wire.WriterIdentity, writer)
	b.WriteString("    ]\n    exports = [\n")
	for _, subject := range runsAsServices() {
		fmt.Fprintf(&b, "      { service: %s, accounts: [%s] }\n", q(subject), q(mesh))
	}
	fmt.Fprintf(&b, "      { stream: %s, accounts: [%s] }\n", q(runsAsStream()), q(mesh))
	b.WriteString("    ]\n  }\n")

	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users = [\n", q(mesh))
	for _, node := range r.Nodes {
		p, err := NodeRunsAs(node, r.Hosts[node]...)
		if err != nil {
			return "", err
		}
		writeUser(&b, node, p)
	}
	for _, provider := range r.Providers {
		p, err := Provider(provider)
		if err != nil {
			return "", err
		}
		writeUser(&b, provider, p)
	}
	b.WriteString("    ]\n    imports = [\n")
	for _, subject := range runsAsServices() {
		fmt.Fprintf(&b, "      { service: { account: %s, subject: %s }", q(server), q(subject))
		if local := runsAsLocal(subject); local != subject {
			fmt.Fprintf(&b, ", to: %s", q(local))
		}
		b.WriteString(" }\n")
	}
	fmt.Fprintf(&b, "      { stream: { account: %s, subject: %s }, to: %s }\n", q(server), q(runsAsStream()), q(runsAsLocal(runsAsStream())))
	b.WriteString("    ]\n  }\n}")
	return b.String(), nil
}

func writeUser(b *strings.Builder, user string, p Permissions) {
	perms := strings.ReplaceAll(p.Config(), "\n", "\n      ")
	fmt.Fprintf(b, "      { user: %s, password: $%s, permissions: %s }\n", strconv.Quote(user), PasswordVariable(user), perms)
}

// runsAsServices are the subjects the server's account exports to the mesh
// account, each a service: the verbs, read and write, addressed to a node
// or a provider. Nothing of JetStream: a request into it would be answered
// on a reply subject of the asker's choosing.
func runsAsServices() []string {
	return []string{
		wire.NodeSubject(wire.ProvisioningSubject, "*"), wire.NodeSubject(wire.ComposeSubject, "*"),
		wire.NodeSubject(wire.PutSubject, "*"), wire.NodeSubject(wire.DeleteSubject, "*"), wire.NodeSubject(wire.ApplySubject, "*"),
		wire.DeclareSubjectOf("*", "*"), wire.ProviderSubject("*"), wire.NodeSubject(wire.BindSubject, "*"),
	}
}

// runsAsStream is the subject the server's account exports to the mesh
// account as a stream: every write of a plan digest, heard by the node
// whose key it is.
func runsAsStream() string { return wire.KVSubject(keys.PlansBucket, "*") }

// runsAsLocal is the subject under which the mesh account imports subject:
// the verbs as they are, the JetStream subjects under wire.RunsAsAPIPrefix,
// where a client made with jetstream.NewWithAPIPrefix sends them.
func runsAsLocal(subject string) string {
	if api, ok := strings.CutPrefix(subject, "$JS.API."); ok {
		return wire.RunsAsAPIPrefix + "." + api
	}
	if strings.HasPrefix(subject, wire.KVRoot+".") {
		return wire.RunsAsAPIPrefix + "." + subject
	}
	return subject
}

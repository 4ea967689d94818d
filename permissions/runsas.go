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
// account owns the five buckets (so it alone can write the registry and the
// seat: nothing of them is exported), and the mesh account, where the nodes
// are, imports from it exactly what a node's client needs:
//
//   - both verbs' node-addressed subjects (mesh-provisioner.compose.*, ...),
//     as services;
//   - each state bucket's key subjects $KV.<bucket>.>, as a service imported
//     under wire.RunsAsAPIPrefix: a node's put is a request, the bucket's
//     stream in the server's account stores it and its acknowledgement is
//     the response. Each node's own user permissions (NodeRunsAs) narrow the
//     import to its keys <node>.>;
//   - each state bucket's $JS.API.STREAM.INFO, likewise, to bind the bucket;
//   - what a node's plan watch needs of the plans bucket (watchOwnPlan),
//     under the same prefix: its stream information and the direct get of
//     the last message on one key's subject, as services, and the keys'
//     subjects $KV.mesh-provisioner_plans.*, as a stream, which each node's
//     permissions narrow to its own key.
//
// Everything else of the server's account, its JetStream API above all,
// cannot be reached from the mesh account.
type RunsAs struct {
	// ServerAccount is the server's account; empty means "PROVISIONER".
	ServerAccount string
	// MeshAccount is the nodes' account; empty means "MESH".
	MeshAccount string
	// Nodes are the nodes whose users the mesh account holds.
	Nodes []string
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
	// The providers' buckets are in the mesh account, which exports none:
	// their provisions read as pending (docs/security.md).
	writer, err := ServerWriter()
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
		p, err := NodeRunsAs(node)
		if err != nil {
			return "", err
		}
		writeUser(&b, node, p)
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
// account, each a service.
func runsAsServices() []string {
	out := []string{wire.NodeSubject(wire.ProvisioningSubject, "*"), wire.NodeSubject(wire.ComposeSubject, "*")}
	for _, bucket := range keys.StateBuckets() {
		out = append(out, kvSubjects(bucket, ""), jsAPI("STREAM.INFO", wire.StreamOf(bucket)))
	}
	plans := wire.StreamOf(keys.PlansBucket)
	return append(out, jsAPI("STREAM.INFO", plans), jsAPI("DIRECT.GET", plans)+"."+runsAsStream())
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

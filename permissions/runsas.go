package permissions

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// DefaultServerAccount is the server's account of RunsAs when none is named.
const DefaultServerAccount = "PROVISIONER"

// RunsAs is a mesh whose server runs in an account of its own, and each node
// and each provider in an account of its own too. The server's account owns
// every bucket and alone publishes into them; an identity's account imports
// from it exactly what that identity's client needs, and nothing of any
// other identity:
//
//   - its own verbs' subjects (a node's mesh-provisioner.compose.<node>,
//     mesh-provisioner.put.<node>, mesh-provisioner.declare.<node>.<provider>
//     for the providers it hosts, ...; a provider's
//     mesh-provisioner.provisions.<provider> and mesh-provisioner.bind.<provider>),
//     as services;
//   - a node's plan key subject $KV.mesh-provisioner_plans.<node>, as a
//     stream imported under wire.RunsAsAPIPrefix: the node hears its plan
//     change there.
//
// An account is the only boundary nats-server draws around a reply
// subject: across an import, the service sees a reply of nats-server's
// making (_R_.<token>) and cannot tell whose inbox the asker named, and
// nats-server delivers the answer to whatever subscribes to it in the
// asker's account. With one identity an account, that is the asker alone.
// No identity's account holds a stream, so no answer is stored.
type RunsAs struct {
	// ServerAccount is the server's account; empty means "PROVISIONER".
	ServerAccount string
	// Nodes are the nodes, each given an account (AccountOf).
	Nodes []string
	// Providers are the providers, each given an account; the server's
	// writer follows and writes their buckets.
	Providers []string
	// Hosts names, by node, the providers whose manifests it declares.
	Hosts map[string][]string
	// Partitions, 2 or more, splits the nodes and providers into that many
	// partitions (wire.PartitionMappings): each account imports its verbs
	// from their partition's subjects, where the service answers them
	// (serve --partitions), under the subjects its client publishes to.
	Partitions int
}

// AccountOf is the account of a node's or a provider's user in RunsAs:
// "node_<name>" or "provider_<name>", so that no two identities share one.
func AccountOf(role wire.Role, name string) string { return string(role) + "_" + name }

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

// Config returns the nats-server "accounts" block of the mesh: the server's
// account with JetStream and its two users, an account per node and per
// provider with its one user and permissions, and the exports and imports
// between them.
func (r RunsAs) Config() (string, error) {
	server := r.ServerAccount
	if server == "" {
		server = DefaultServerAccount
	}
	if err := CheckPartitions(r.Partitions); err != nil {
		return "", err
	}
	type identity struct {
		account, user string
		grant         Permissions
		imports       []string // services
		stream        string   // the plan key a node hears
	}
	var identities []identity
	for _, node := range r.Nodes {
		p, err := NodeRunsAs(node, r.Hosts[node]...)
		if err != nil {
			return "", err
		}
		imports := []string{
			wire.NodeSubject(wire.ProvisioningSubject, node), wire.NodeSubject(wire.ComposeSubject, node),
			wire.NodeSubject(wire.PutSubject, node), wire.NodeSubject(wire.DeleteSubject, node), wire.NodeSubject(wire.ApplySubject, node),
		}
		for _, provider := range r.Hosts[node] {
			imports = append(imports, wire.DeclareSubjectOf(node, provider))
		}
		identities = append(identities, identity{AccountOf(wire.RoleNode, node), node, p, imports, wire.KVSubject(keys.PlansBucket, node)})
	}
	for node := range r.Hosts {
		if !slices.Contains(r.Nodes, node) {
			return "", fmt.Errorf("runs-as: --hosts names node %q, which is not among the nodes", node)
		}
	}
	for _, provider := range r.Providers {
		p, err := Provider(provider)
		if err != nil {
			return "", err
		}
		imports := []string{wire.ProviderSubject(provider), wire.NodeSubject(wire.BindSubject, provider)}
		identities = append(identities, identity{AccountOf(wire.RoleProvider, provider), provider, p, imports, ""})
	}
	accounts := []string{server}
	for _, id := range identities {
		if slices.Contains(accounts, id.account) {
			return "", fmt.Errorf("runs-as: account %q is named twice", id.account)
		}
		accounts = append(accounts, id.account)
	}
	q := strconv.Quote
	importers := make([]string, 0, len(identities))
	for _, id := range identities {
		importers = append(importers, q(id.account))
	}
	var b strings.Builder
	b.WriteString("accounts {\n")
	fmt.Fprintf(&b, "  %s {\n    jetstream: enabled\n    users = [\n", q(server))
	writeUser(&b, wire.ServerIdentity, Server())
	writer, err := ServerWriter(r.Providers...)
	if err != nil {
		return "", err
	}
	writeUser(&b, wire.WriterIdentity, writer)
	b.WriteString("    ]\n")
	if len(identities) > 0 {
		b.WriteString("    exports = [\n")
		for _, subject := range runsAsServices() {
			if r.Partitions > 1 {
				subject += ".*"
			}
			fmt.Fprintf(&b, "      { service: %s, accounts: [%s] }\n", q(subject), strings.Join(importers, ", "))
		}
		fmt.Fprintf(&b, "      { stream: %s, accounts: [%s] }\n", q(wire.KVSubject(keys.PlansBucket, "*")), strings.Join(importers, ", "))
		b.WriteString("    ]\n")
	}
	b.WriteString("  }\n")
	for _, id := range identities {
		fmt.Fprintf(&b, "  %s {\n    users = [\n", q(id.account))
		writeUser(&b, id.user, id.grant)
		b.WriteString("    ]\n    imports = [\n")
		for _, subject := range id.imports {
			if r.Partitions > 1 {
				fmt.Fprintf(&b, "      { service: { account: %s, subject: %s }, to: %s }\n", q(server), q(wire.PartitionedSubject(subject, r.Partitions)), q(subject))
				continue
			}
			fmt.Fprintf(&b, "      { service: { account: %s, subject: %s } }\n", q(server), q(subject))
		}
		if id.stream != "" {
			fmt.Fprintf(&b, "      { stream: { account: %s, subject: %s }, to: %s }\n", q(server), q(id.stream), q(wire.RunsAsAPIPrefix+"."+id.stream))
		}
		b.WriteString("    ]\n  }\n")
	}
	b.WriteString("}")
	return b.String(), nil
}

func writeUser(b *strings.Builder, user string, p Permissions) {
	perms := strings.ReplaceAll(p.Config(), "\n", "\n      ")
	fmt.Fprintf(b, "      { user: %s, password: $%s, permissions: %s }\n", strconv.Quote(user), PasswordVariable(user), perms)
}

// runsAsServices are the subjects the server's account exports, each a
// service: the verbs, read and write, addressed to a node or a provider;
// each identity's account imports its own of them. Nothing of JetStream: a
// request into it would be answered on a reply subject of the asker's
// choosing.
func runsAsServices() []string {
	return []string{
		wire.NodeSubject(wire.ProvisioningSubject, "*"), wire.NodeSubject(wire.ComposeSubject, "*"),
		wire.NodeSubject(wire.PutSubject, "*"), wire.NodeSubject(wire.DeleteSubject, "*"), wire.NodeSubject(wire.ApplySubject, "*"),
		wire.DeclareSubjectOf("*", "*"), wire.ProviderSubject("*"), wire.NodeSubject(wire.BindSubject, "*"),
	}
}

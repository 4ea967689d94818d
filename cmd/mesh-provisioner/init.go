package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/nats-io/jsm.go/natscontext"
	"github.com/nats-io/nkeys"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/wire"
)

const initSynopsis = `Usage: mesh-provisioner init DIR --nodes ace,bob [--providers pg] [--operators alice] [--hosts ace:pg] [--url nats://127.0.0.1:4222]

Writes what a fresh mesh needs, for a nats-server that listens at --url:
  DIR/nats-server.conf     JetStream on (its store in DIR/jetstream), and a user
                           for each identity with the permissions
                           'mesh-provisioner permissions' prints, authenticated
                           by an nkey (no password anywhere)
  DIR/keys/*.nk            each identity's nkey seed, readable by its owner only
  DIR/contexts/*.json      a natscli context for each identity (URL, nkey, inbox
                           prefix): server.json and server-writer.json for the
                           service's two identities, node-<name>.json,
                           provider-<name>.json, operator-<name>.json; give one
                           to any command's --context, or copy it where natscli
                           keeps contexts for nats --context
  DIR/README.md            the commands that start nats-server, the service and
                           each node's client

Run again on the same DIR with more names to add them: the identities already
there keep their keys. A DIR that holds anything else is refused unless
--force is given.`

// initState is what init wrote, kept in DIR so that running it again adds to
// it.
type initState struct {
	URL       string              `json:"url"`
	Nodes     []string            `json:"nodes"`
	Providers []string            `json:"providers"`
	Operators []string            `json:"operators"`
	Hosts     map[string][]string `json:"hosts,omitempty"`
	// Partitions, 2 or more, is how many partitions the nodes and
	// providers are split into (serve --partitions).
	Partitions int `json:"partitions,omitempty"`
}

// initStateFile names initState's file in DIR.
const initStateFile = "mesh-provisioner-init.json"

// identity is one user of the mesh's nats-server.
type initIdentity struct {
	role wire.Role
	name string
	// file is the base name of its key and context: server, server-writer,
	// node-ace...
	file  string
	grant permissions.Permissions
}

func defineInit(fs *flag.FlagSet) action {
	var (
		nodes, providers, operators, hosts string
		natsURL                            string
		force                              bool
		partitions                         int
	)
	fs.StringVar(&nodes, "nodes", "", "comma-separated names of the mesh's nodes")
	fs.StringVar(&providers, "providers", "", "comma-separated names of the provider modules")
	fs.StringVar(&operators, "operators", "", "comma-separated names of the operators")
	fs.StringVar(&hosts, "hosts", "", "comma-separated node:provider pairs: the node runs the provider and declares its manifest")
	fs.StringVar(&natsURL, "url", defaultClientURL, "the URL the mesh's nats-server listens at, and every context connects to")
	fs.BoolVar(&force, "force", false, "write into DIR even if it holds files init did not write")
	fs.IntVar(&partitions, "partitions", 0, "split the nodes and providers into this many partitions (2 to 1024; serve --partitions): nats-server.conf maps each verb's subject to its asker's partition, and each node's and provider's grant names its own; 0 keeps what an earlier init wrote (none at first)")
	return func(_ context.Context, inv invocation) error {
		if inv.word == "" {
			return errors.New("init: name the directory to write: mesh-provisioner init DIR --nodes ace,bob")
		}
		if err := permissions.CheckPartitions(partitions); err != nil {
			return fmt.Errorf("--%w", err)
		}
		want := initState{URL: natsURL, Nodes: splitList(nodes), Providers: splitList(providers), Operators: splitList(operators), Hosts: map[string][]string{}, Partitions: partitions}
		for _, pair := range splitList(hosts) {
			node, provider, ok := strings.Cut(pair, ":")
			if !ok {
				return fmt.Errorf("--hosts %q: write each pair as node:provider", pair)
			}
			want.Hosts[node] = append(want.Hosts[node], provider)
		}
		written, err := writeInit(inv.word, want, force)
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(inv.stdout, "wrote %s: nats-server.conf, README.md and, for %d identities, keys/ and contexts/; next: %s\n",
			inv.word, written, "nats-server -c "+filepath.Join(inv.word, "nats-server.conf"))
		return err
	}
}

// writeInit writes want's mesh into dir, with what an earlier init wrote
// there, and returns how many identities it holds.
func writeInit(dir string, want initState, force bool) (int, error) {
	state, err := readInitState(dir, force)
	if err != nil {
		return 0, err
	}
	if state.URL != "" && want.URL != state.URL && want.URL != defaultClientURL {
		return 0, fmt.Errorf("init: %s was written for %s; run it again with that --url, or start afresh in another directory", dir, state.URL)
	}
	if state.URL == "" {
		state.URL = want.URL
	}
	if want.Partitions > 0 {
		state.Partitions = want.Partitions
	}
	state.Nodes = union(state.Nodes, want.Nodes)
	state.Providers = union(state.Providers, want.Providers)
	state.Operators = union(state.Operators, want.Operators)
	if state.Hosts == nil {
		state.Hosts = map[string][]string{}
	}
	for node, provided := range want.Hosts {
		if !slices.Contains(state.Nodes, node) {
			return 0, fmt.Errorf("--hosts: %s is not among --nodes", node)
		}
		state.Hosts[node] = union(state.Hosts[node], provided)
	}
	listen, err := listenOf(state.URL)
	if err != nil {
		return 0, err
	}
	ids, err := identitiesOf(state)
	if err != nil {
		return 0, err
	}
	for _, sub := range []string{"keys", "contexts"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return 0, err
		}
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return 0, err
	}
	var users strings.Builder
	for _, id := range ids {
		seedFile := filepath.Join(abs, "keys", id.file+".nk")
		public, err := userKey(seedFile)
		if err != nil {
			return 0, err
		}
		fmt.Fprintf(&users, "    # %s %s\n    { nkey: %q, permissions: %s }\n", id.role, id.name, public, indent(id.grant.Config(), "    "))
		if err := writeContext(filepath.Join(abs, "contexts", id.file+".json"), id, state.URL, seedFile); err != nil {
			return 0, err
		}
	}
	conf := fmt.Sprintf(`# The mesh's nats-server, written by mesh-provisioner init: start it with
#   nats-server -c %s
# Each user is one identity, authenticated by its nkey (its seed is in keys/),
# with the permissions 'mesh-provisioner permissions' prints for it.
listen: %q
jetstream {
  store_dir: %q
}
authorization {
  users = [
%s  ]
}
%s`, filepath.Join(abs, "nats-server.conf"), listen, filepath.Join(abs, "jetstream"), users.String(), mappingsOf(state.Partitions))
	if err := os.WriteFile(filepath.Join(dir, "nats-server.conf"), []byte(conf), 0o600); err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte(initReadme(abs, state)), 0o644); err != nil { //nolint:gosec // instructions, no secret
		return 0, err
	}
	data, err := json.MarshalIndent(state, "", "  ")
	if err != nil {
		return 0, err
	}
	if err := os.WriteFile(filepath.Join(dir, initStateFile), append(data, '\n'), 0o600); err != nil {
		return 0, err
	}
	return len(ids), nil
}

// readInitState reads what an earlier init wrote in dir: nothing for a
// missing or empty dir; a dir holding anything else is refused unless
// force.
func readInitState(dir string, force bool) (initState, error) {
	var state initState
	data, err := os.ReadFile(filepath.Join(dir, initStateFile))
	switch {
	case err == nil:
		if err := json.Unmarshal(data, &state); err != nil {
			return state, fmt.Errorf("init: %s: %w", filepath.Join(dir, initStateFile), err)
		}
		return state, nil
	case !errors.Is(err, fs.ErrNotExist):
		return state, err
	}
	entries, err := os.ReadDir(dir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return state, err
	}
	if len(entries) > 0 && !force {
		return state, fmt.Errorf("init: %s holds files that init did not write; give an empty or new directory, or --force to write beside them", dir)
	}
	return state, nil
}

// identitiesOf returns state's identities, the service's two first, each
// with its permissions.
func identitiesOf(state initState) ([]initIdentity, error) {
	writer, err := permissions.ServerWriter(state.Providers...)
	if err != nil {
		return nil, err
	}
	ids := []initIdentity{
		{role: wire.RoleServer, name: wire.ServerIdentity, file: "server", grant: permissions.Server()},
		{role: wire.RoleServer, name: wire.WriterIdentity, file: "server-writer", grant: writer},
	}
	for _, node := range state.Nodes {
		grant, err := permissions.Node(node, state.Hosts[node]...)
		if err != nil {
			return nil, err
		}
		grant = grant.Partitioned(state.Partitions)
		ids = append(ids, initIdentity{role: wire.RoleNode, name: node, file: "node-" + node, grant: grant})
	}
	for _, provider := range state.Providers {
		grant, err := permissions.Provider(provider)
		if err != nil {
			return nil, err
		}
		grant = grant.Partitioned(state.Partitions)
		ids = append(ids, initIdentity{role: wire.RoleProvider, name: provider, file: "provider-" + provider, grant: grant})
	}
	for _, operator := range state.Operators {
		grant, err := permissions.Operator(operator, state.Providers...)
		if err != nil {
			return nil, err
		}
		ids = append(ids, initIdentity{role: wire.RoleOperator, name: operator, file: "operator-" + operator, grant: grant})
	}
	seen := map[string]bool{}
	for _, id := range ids {
		if err := keys.CheckToken(id.name); err != nil {
			return nil, fmt.Errorf("init: %s %q %w", id.role, id.name, err)
		}
		if seen[id.file] {
			return nil, fmt.Errorf("init: %s is named twice", id.file)
		}
		seen[id.file] = true
	}
	return ids, nil
}

// userKey returns the public key of the user nkey whose seed is in file,
// creating the seed first if there is none.
func userKey(file string) (string, error) {
	seed, err := os.ReadFile(file)
	if errors.Is(err, fs.ErrNotExist) {
		kp, err := nkeys.CreateUser()
		if err != nil {
			return "", err
		}
		if seed, err = kp.Seed(); err != nil {
			return "", err
		}
		if err := os.WriteFile(file, append(seed, '\n'), 0o600); err != nil {
			return "", err
		}
	} else if err != nil {
		return "", err
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(seed))))
	if err != nil {
		return "", fmt.Errorf("%s: %w", file, err)
	}
	return kp.PublicKey()
}

// writeContext writes id's natscli context: the URL, its seed's file and its
// inbox prefix, as natscli's own library writes one.
func writeContext(file string, id initIdentity, natsURL, seedFile string) error {
	nctx, err := natscontext.New(strings.TrimSuffix(filepath.Base(file), ".json"), false,
		natscontext.WithServerURL(natsURL),
		natscontext.WithNKey(seedFile),
		natscontext.WithInboxPrefix(wire.InboxPrefix(id.role, id.name)),
		natscontext.WithDescription(fmt.Sprintf("mesh-provisioner %s %s", id.role, id.name)))
	if err != nil {
		return err
	}
	data, err := nctx.MarshalJSON()
	if err != nil {
		return err
	}
	return os.WriteFile(file, append(data, '\n'), 0o600)
}

// listenOf returns the host:port a nats-server at natsURL listens on.
func listenOf(natsURL string) (string, error) {
	u, err := url.Parse(natsURL)
	if err != nil || u.Scheme != "nats" || u.Hostname() == "" || u.Port() == "" || u.User != nil {
		return "", fmt.Errorf("--url %q: give one nats://HOST:PORT, without credentials", natsURL)
	}
	return u.Host, nil
}

func union(a, b []string) []string {
	out := slices.Clone(a)
	for _, x := range b {
		if !slices.Contains(out, x) {
			out = append(out, x)
		}
	}
	return out
}

// mappingsOf is nats-server.conf's mappings of a mesh of n partitions,
// with what they are for; "" for fewer than 2.
func mappingsOf(n int) string {
	if n < 2 {
		return ""
	}
	return fmt.Sprintf("# Each verb's subject, mapped to its asker's partition (serve --partitions %d).\n%s\n", n, permissions.MappingsConfig(n))
}

func indent(block, prefix string) string {
	return strings.ReplaceAll(strings.TrimRight(block, "\n"), "\n", "\n"+prefix)
}

// initReadme is DIR/README.md: the commands, with dir's absolute path.
func initReadme(dir string, state initState) string {
	ctx := func(file string) string { return filepath.Join(dir, "contexts", file+".json") }
	var b strings.Builder
	fmt.Fprintf(&b, "# A mesh written by mesh-provisioner init\n\n")
	fmt.Fprintf(&b, "Its nats-server listens at %s. Each identity has a key in `keys/` and a natscli context in\n`contexts/`; keep both where only that identity's owner reads them.\n\n", state.URL)
	fmt.Fprintf(&b, "1. Start nats-server:\n\n       nats-server -c %s\n\n", filepath.Join(dir, "nats-server.conf"))
	partitions := ""
	if state.Partitions > 1 {
		partitions = fmt.Sprintf(" --partitions %d", state.Partitions)
	}
	fmt.Fprintf(&b, "2. Check that the service's identities have what it needs, then start it:\n\n       mesh-provisioner check --context %s --writer-context %s\n       mesh-provisioner serve --context %s --writer-context %s%s\n\n",
		ctx("server"), ctx("server-writer"), ctx("server"), ctx("server-writer"), partitions)
	if len(state.Nodes) > 0 {
		node := state.Nodes[0]
		fmt.Fprintf(&b, "3. On each node, its client writes and reads as the node, with the node's context only; for %s:\n\n", node)
		fmt.Fprintf(&b, "       mesh-provisioner put need --context %s --node %s --module web --placeholder '${port:http}'\n", ctx("node-"+node), node)
		fmt.Fprintf(&b, "       mesh-provisioner query compose --context %s --node %s\n\n", ctx("node-"+node), node)
		fmt.Fprintf(&b, "   The nats CLI reads the same context once it is copied where natscli keeps contexts:\n\n")
		fmt.Fprintf(&b, "       cp %s ~/.config/nats/context/\n       nats --context node-%s req mesh-provisioner.compose.%s '{\"node\":\"%s\"}' --inbox-prefix %s\n\n",
			ctx("node-"+node), node, node, node, wire.InboxPrefix(wire.RoleNode, node))
	}
	if len(state.Operators) > 0 {
		fmt.Fprintf(&b, "4. An operator sees the mesh:\n\n       mesh-provisioner status --context %s\n\n", ctx("operator-"+state.Operators[0]))
	}
	fmt.Fprintf(&b, "Add a node: run `mesh-provisioner init %s --nodes NEW` again and restart nats-server (or\n`nats-server --signal reload`); the identities already here keep their keys.\n", dir)
	return b.String()
}

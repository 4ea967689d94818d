package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"strings"

	"github.com/novox/mesh-provisioner/permissions"
)

const permissionsSynopsis = `Usage: mesh-provisioner permissions (--node NAME | --server | --server-writer | --provider MODULE | --operator NAME | --runs-as NODES | --mappings) [--providers MODULES] [--partitions N] [--json]

Prints the NATS permissions of one identity of the mesh, granting the least
that works, as a block to stand as a user's "permissions" in a nats-server
configuration (or as JSON with --json, which nats-server reads too):

  --node NAME        a node's provisioner client: asks the service's verbs
                     of NAME alone, and writes only its own records through
                     them; with --providers, declares the manifests of the
                     providers it runs
  --server           the mesh-provisioner server's answering identity: serve
                     --nats-url/--creds; subscribes to its verbs and
                     discovery, publishes only to inboxes, writes nothing
  --server-writer    the server's writing identity: serve --writer-nats-url/
                     --writer-creds; creates and watches the buckets, holds
                     the seat, writes the registry, answers nothing;
                     with --providers (comma-separated modules), also
                     follows the keys of each provider's bucket
                     MODULE_bound, so that compositions say what is bound
  --provider MODULE  a provider module: asks what it must provision
                     (mesh-provisioner.provisions.MODULE), writes its own
                     bucket MODULE_bound through mesh-provisioner.bind.MODULE,
                     reads no provisioning bucket
  --operator NAME    an operator: reads the whole mesh (status, query of any
                     node, capture), writes nothing; with --providers, also
                     the keys of each provider's bucket (capture)

  --runs-as NODES    the nats-server "accounts" block of a mesh whose server
                     runs in an account of its own (PROVISIONER), and each
                     node (comma-separated) and each of --providers in an
                     account of its own (node_NAME, provider_MODULE), which
                     imports its own verbs and, a node's, its plan key
                     under $PROVISIONER.API; --hosts NODE:PROVIDER,...
                     names the providers each node runs; passwords are read
                     from the environment ($ACE_PASSWORD for node ace)
  --mappings         with --partitions N, the nats-server "mappings" block
                     that routes each verb's subject to its asker's
                     partition (serve --partitions N), to stand at the top
                     of the configuration

  --partitions N     in a mesh split into N partitions (2 to 1024): a
                     node's and a provider's grant names its verbs'
                     subjects as nats-server maps them, its own
                     partition's and no other's; --runs-as imports them

Nodes and providers publish nothing into JetStream: they write through the
service's verbs, which check each write and store it with the writer's
identity.

Each identity connects with the inbox prefix _INBOX_MESH.<role>.<name>
(_INBOX_MESH.node.NAME, _INBOX_MESH.server.mesh-provisioner-writer,
_INBOX_MESH.provider.MODULE, _INBOX_MESH.operator.NAME); the answering
identity needs none. See
docs/security.md for a worked example.`

func definePermissions(fs *flag.FlagSet) action {
	node := fs.String("node", "", "the node whose client the permissions are for")
	server := fs.Bool("server", false, "the permissions of the mesh-provisioner server's answering identity")
	writer := fs.Bool("server-writer", false, "the permissions of the mesh-provisioner server's writing identity")
	providers := fs.String("providers", "", "with --server-writer or --operator: the provider modules whose buckets it reads the keys of; with --node: those the node runs, whose manifests it declares; with --runs-as: the providers' users (comma-separated)")
	hosts := fs.String("hosts", "", "with --runs-as: NODE:PROVIDER pairs, comma-separated, each a provider the node runs")
	provider := fs.String("provider", "", "the provider module the permissions are for")
	operator := fs.String("operator", "", "the operator whose identity the permissions are for")
	asJSON := fs.Bool("json", false, "print JSON instead of nats-server configuration text")
	runsAs := fs.String("runs-as", "", "the accounts configuration of a mesh whose server runs in its own account, for these nodes (comma-separated)")
	mappings := fs.Bool("mappings", false, "with --partitions, the nats-server mappings block of the partitions")
	partitions := fs.Int("partitions", 0, "the partitions the mesh is split into (serve --partitions): 0, or 2 to 1024")
	return func(_ context.Context, inv invocation) error {
		warnAll(slog.New(slog.NewTextHandler(inv.stderr, nil)), inv.warnings)
		var chosen int
		for _, set := range []bool{*node != "", *server, *writer, *provider != "", *operator != "", *runsAs != "", *mappings} {
			if set {
				chosen++
			}
		}
		if chosen != 1 {
			return errors.New("permissions: give exactly one of --node NAME, --server, --server-writer, --provider MODULE, --operator NAME, --runs-as NODES or --mappings")
		}
		if err := permissions.CheckPartitions(*partitions); err != nil {
			return fmt.Errorf("permissions: --%w", err)
		}
		if *mappings {
			if *partitions < 2 {
				return errors.New("permissions: --mappings needs --partitions N, 2 or more")
			}
			_, err := fmt.Fprintln(inv.stdout, permissions.MappingsConfig(*partitions))
			return err
		}
		if *providers != "" && !*writer && *operator == "" && *node == "" && *runsAs == "" {
			return errors.New("permissions: --providers goes with --server-writer, --operator, --node or --runs-as")
		}
		if *hosts != "" && *runsAs == "" {
			return errors.New("permissions: --hosts goes with --runs-as; give a node's providers with --node NAME --providers MODULES")
		}
		var modules []string
		if *providers != "" {
			modules = strings.Split(*providers, ",")
		}
		if *runsAs != "" {
			if *asJSON {
				return errors.New("permissions: --runs-as prints configuration text only")
			}
			byNode := map[string][]string{}
			for _, pair := range splitList(*hosts) {
				n, p, ok := strings.Cut(pair, ":")
				if !ok {
					return fmt.Errorf("permissions: --hosts %q: write NODE:PROVIDER pairs, comma-separated", *hosts)
				}
				byNode[n] = append(byNode[n], p)
			}
			text, err := permissions.RunsAs{Nodes: strings.Split(*runsAs, ","), Providers: modules, Hosts: byNode, Partitions: *partitions}.Config()
			if err != nil {
				return err
			}
			_, err = fmt.Fprintln(inv.stdout, text)
			return err
		}
		var p permissions.Permissions
		var err error
		switch {
		case *server:
			p = permissions.Server()
		case *writer:
			p, err = permissions.ServerWriter(modules...)
		case *node != "":
			p, err = permissions.Node(*node, modules...)
			p = p.Partitioned(*partitions)
		case *operator != "":
			p, err = permissions.Operator(*operator, modules...)
		default:
			p, err = permissions.Provider(*provider)
			p = p.Partitioned(*partitions)
		}
		if err != nil {
			return err
		}
		text := p.Config()
		if *asJSON {
			text = p.JSON()
		}
		_, err = fmt.Fprintln(inv.stdout, text)
		return err
	}
}

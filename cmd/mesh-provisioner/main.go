// Command mesh-provisioner is the provisioner's server of a NATS mesh: it
// keeps the registry, watches the provisioning state buckets, and answers the
// read-only verbs mesh-provisioner.provisioning and mesh-provisioner.compose
// as a NATS micro service. Its other commands (query, permissions, capture,
// simulate) are the operator's tools around it.
//
// Run with no arguments it serves on an embedded nats-server with JetStream;
// with --nats-url it joins an existing NATS. See --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"strings"
	"syscall"
)

// version is set at build time (-ldflags "-X main.version=1.2.3"); otherwise
// it is read from the module's build information.
var version = ""

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintf(os.Stderr, "mesh-provisioner: %v\n", err)
			stop()
			os.Exit(1)
		}
	}
}

// commands are the subcommands; the first argument picks one, and anything
// else (a flag, or nothing) means serve.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"serve":       serve,
	"permissions": permissionsCommand,
	"query":       query,
	"capture":     captureCommand,
	"simulate":    simulate,
	"version": func(_ context.Context, _ []string, stdout, _ io.Writer) error {
		_, err := fmt.Fprintln(stdout, buildVersion())
		return err
	},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "help" {
		args = []string{"--help"} // the serve usage, which names the commands
	}
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, ok := commands[args[0]]
		if !ok {
			return fmt.Errorf("unknown command %q; run mesh-provisioner --help", args[0])
		}
		return cmd(ctx, args[1:], stdout, stderr)
	}
	return serve(ctx, args, stdout, stderr)
}

// buildVersion returns the semantic version micro discovery shows.
func buildVersion() string {
	if version != "" {
		return version
	}
	if info, ok := debug.ReadBuildInfo(); ok && strings.HasPrefix(info.Main.Version, "v") {
		return strings.TrimPrefix(info.Main.Version, "v")
	}
	return "0.0.0-dev"
}

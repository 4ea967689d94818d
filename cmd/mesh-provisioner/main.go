// Command mesh-provisioner is the provisioner's server of a NATS mesh
// (serve): it keeps the registry and each node's plan digest while it holds
// the provisioner seat, watches the provisioning buckets and the providers',
// and answers as a NATS micro service the read verbs
// (mesh-provisioner.provisioning, mesh-provisioner.compose,
// mesh-provisioner.provisions.<provider>) and the write verbs (put, delete,
// apply, declare, bind) through which alone the buckets are written. Its
// other commands are the tools around it: init writes a fresh mesh's
// nats-server configuration, keys and contexts, permissions prints one
// identity's permissions, and check says whether the service can run with
// its identities; query and status read a running mesh, capture saves its
// buckets and simulate writes a synthetic one; put and delete write one
// record of a node as the node would; version prints the version.
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

// command is one subcommand: its usage, and its flags with what runs it.
type command struct {
	synopsis string
	// define registers the command's flags on fs and returns what runs the
	// command once they are parsed. Tests call it to see every flag.
	define func(fs *flag.FlagSet) action
	// word says the command takes a leading word before its flags, as
	// query takes what to ask.
	word bool
}

// action runs a command whose flags are parsed.
type action func(ctx context.Context, inv invocation) error

// invocation is what a command runs with besides its flags.
type invocation struct {
	word           string
	stdout, stderr io.Writer
	// warnings are about the environment (variables no longer read), for
	// the command to log once its logger is built.
	warnings []string
	// lookupEnv reads the environment (os.LookupEnv but in tests): for the
	// variables natscli reads too, after the command's own (resolve).
	lookupEnv func(string) (string, bool)
}

// commands are the subcommands; the first argument picks one, and anything
// else (a flag, or nothing) means serve.
var commands = map[string]command{
	"serve":       {synopsis: serveSynopsis, define: defineServe},
	"permissions": {synopsis: permissionsSynopsis, define: definePermissions},
	"query":       {synopsis: querySynopsis, define: defineQuery, word: true},
	"status":      {synopsis: statusSynopsis, define: defineStatus},
	"capture":     {synopsis: captureSynopsis, define: defineCapture},
	"simulate":    {synopsis: simulateSynopsis, define: defineSimulate},
	"put":         {synopsis: putSynopsis, define: definePut, word: true},
	"delete":      {synopsis: deleteSynopsis, define: defineDelete, word: true},
	"init":        {synopsis: initSynopsis, define: defineInit, word: true},
	"check":       {synopsis: checkSynopsis, define: defineCheck},
	"version": {synopsis: "Usage: mesh-provisioner version\n\nPrints the version micro discovery shows.", define: func(*flag.FlagSet) action {
		return func(_ context.Context, inv invocation) error {
			_, err := fmt.Fprintln(inv.stdout, buildVersion())
			return err
		}
	}},
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return runWithEnv(ctx, args, os.LookupEnv, stdout, stderr)
}

// runWithEnv runs a command with its variables read through lookupEnv.
func runWithEnv(ctx context.Context, args []string, lookupEnv func(string) (string, bool), stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "help" {
		args = []string{"--help"} // the serve usage, which names the commands
	}
	name := "serve"
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, args = args[0], args[1:]
	}
	cmd, ok := commands[name]
	if !ok {
		return fmt.Errorf("unknown command %q; run mesh-provisioner --help", name)
	}
	inv := invocation{stdout: stdout, stderr: stderr, lookupEnv: lookupEnv}
	if cmd.word && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		inv.word, args = args[0], args[1:]
	}
	fs := flag.NewFlagSet("mesh-provisioner "+name, flag.ContinueOnError)
	act := cmd.define(fs)
	warnings, err := parseFlags(fs, name, args, lookupEnv, stderr, cmd.synopsis)
	if err != nil {
		return err
	}
	inv.warnings = warnings
	return act(ctx, inv)
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

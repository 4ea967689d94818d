package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
)

// envPrefix starts the environment variable of every flag. Each variable
// also names its command: --nats-url of serve is
// MESH_PROVISIONER_SERVE_NATS_URL, of query MESH_PROVISIONER_QUERY_NATS_URL.
// A variable exported for one command (a node's MESH_PROVISIONER_QUERY_NODE,
// a shell's MESH_PROVISIONER_QUERY_NATS_URL) so never reaches another: a
// query URL cannot make serve join a NATS instead of embedding one.
const envPrefix = "MESH_PROVISIONER_"

// envName returns the environment variable that sets a command's flag.
func envName(command, flagName string) string {
	return envPrefix + envToken(command) + "_" + envToken(flagName)
}

// legacyEnvName returns the unscoped variable that set a flag before each
// command had its own; it is no longer read, only warned about.
func legacyEnvName(flagName string) string { return envPrefix + envToken(flagName) }

func envToken(s string) string { return strings.ToUpper(strings.ReplaceAll(s, "-", "_")) }

// parseFlags sets each flag of command from its environment variable, then
// from args, so the command line wins. lookupEnv is os.LookupEnv but in
// tests. It returns a warning for each
// unscoped variable of the old scheme that is set, naming the variable that
// replaces it. Usage lists the variables beside the flags.
func parseFlags(fs *flag.FlagSet, command string, args []string, lookupEnv func(string) (string, bool), stderr io.Writer, synopsis string) (warnings []string, err error) {
	// The flag package would print an error and the whole usage; the
	// command prints the error alone, on one line, and the usage on --help.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.VisitAll(func(f *flag.Flag) {
		if _, ok := lookupEnv(legacyEnvName(f.Name)); ok {
			warnings = append(warnings, fmt.Sprintf("$%s is not read; set $%s instead", legacyEnvName(f.Name), envName(command, f.Name)))
		}
		if err != nil {
			return
		}
		name := envName(command, f.Name)
		if v, ok := lookupEnv(name); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("$%s=%q: %w", name, v, serr)
			}
		}
	})
	if err != nil {
		return warnings, err
	}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		printUsage(fs, command, stderr, synopsis)
		return warnings, err
	case err != nil:
		return warnings, fmt.Errorf("%w; run with --help", err)
	}
	if fs.NArg() > 0 {
		return warnings, fmt.Errorf("unexpected argument %q; run with --help", fs.Arg(0))
	}
	return warnings, nil
}

// printUsage writes a command's synopsis and its flags, each with its
// environment variable.
func printUsage(fs *flag.FlagSet, command string, w io.Writer, synopsis string) {
	fmt.Fprintf(w, "%s\n\nFlags, each also set by its environment variable (the flag wins; a\nvariable names its command, so it sets nothing for another):\n", synopsis)
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, "  --%s  [$%s]\n      %s%s\n", f.Name, envName(command, f.Name), f.Usage, def)
	})
}

// warnAll logs each warning once, at warn.
func warnAll(logger *slog.Logger, warnings []string) {
	for _, w := range warnings {
		logger.Warn(w)
	}
}

// logFlags are the logging flags every command shares.
type logFlags struct {
	format string
	level  slog.Level
}

func (l *logFlags) register(fs *flag.FlagSet, level slog.Level) {
	l.format = "text"
	fs.StringVar(&l.format, "log-format", l.format, "log format: text or json")
	fs.TextVar(&l.level, "log-level", level, "log level: debug, info, warn or error")
}

// logger builds the one logger the command passes down.
func (l *logFlags) logger(w io.Writer) (*slog.Logger, error) {
	opts := &slog.HandlerOptions{Level: l.level}
	switch l.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format %q: use text or json", l.format)
}

// splitList splits a comma-separated flag value, dropping blanks around
// each item and empty items.
func splitList(value string) []string {
	var out []string
	for item := range strings.SplitSeq(value, ",") {
		if item = strings.TrimSpace(item); item != "" {
			out = append(out, item)
		}
	}
	return out
}

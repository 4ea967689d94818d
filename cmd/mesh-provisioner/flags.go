package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
)

// envPrefix starts the environment variable of every flag: --nats-url is
// MESH_PROVISIONER_NATS_URL.
const envPrefix = "MESH_PROVISIONER_"

// envName returns the environment variable that sets a flag.
func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseFlags sets each flag from its environment variable, then from args,
// so the command line wins. Usage lists the variables beside the flags.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer, synopsis string) error {
	// The flag package would print an error and the whole usage; the
	// command prints the error alone, on one line, and the usage on --help.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var err error
	fs.VisitAll(func(f *flag.Flag) {
		if err != nil {
			return
		}
		if v, ok := os.LookupEnv(envName(f.Name)); ok {
			if serr := fs.Set(f.Name, v); serr != nil {
				err = fmt.Errorf("$%s=%q: %v", envName(f.Name), v, serr)
			}
		}
	})
	if err != nil {
		return err
	}
	switch err := fs.Parse(args); {
	case errors.Is(err, flag.ErrHelp):
		printUsage(fs, stderr, synopsis)
		return err
	case err != nil:
		return fmt.Errorf("%v; run with --help", err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q; run with --help", fs.Arg(0))
	}
	return nil
}

// printUsage writes a command's synopsis and its flags, each with its
// environment variable.
func printUsage(fs *flag.FlagSet, w io.Writer, synopsis string) {
	fmt.Fprintf(w, "%s\n\nFlags (each also set by its environment variable):\n", synopsis)
	fs.VisitAll(func(f *flag.Flag) {
		def := ""
		if f.DefValue != "" {
			def = fmt.Sprintf(" (default %q)", f.DefValue)
		}
		fmt.Fprintf(w, "  --%s  [$%s]\n      %s%s\n", f.Name, envName(f.Name), f.Usage, def)
	})
}

// logFlags are the logging flags every command shares.
type logFlags struct {
	format string
	level  slog.Level
}

func (l *logFlags) register(fs *flag.FlagSet) {
	l.format = "text"
	fs.StringVar(&l.format, "log-format", l.format, "log format: text or json")
	fs.TextVar(&l.level, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
}

// logger builds the one logger main passes down.
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

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/synth"
)

const simulateSynopsis = `Usage: mesh-provisioner simulate [--nodes N] [--modules M] [--needs K] [flags]

Acts as N node clients writing a realistic synthetic mesh into a live NATS:
each node's modules need a value of every kind the registry answers (and,
about once in a hundred, one no entry answers or cannot fill), contribute to
collections (shell:zsh:normal, environment:<module>, plugins), record what is
applied, and each node has a few malformed keys. --builds puts a share of
the modules between two builds (b1 wanted, b2 newest); --bound has the
providers (pg, redis, s3, kafka) declare manifests, from the first node, and
bind a share of the bound needs in their buckets (<provider>_bound, made if
missing). The same flags write the same mesh. The buckets must exist: start mesh-provisioner first. For demos,
load and benchmarks (capture it with mesh-provisioner capture).`

func defineSimulate(fs *flag.FlagSet) action {
	var conn connectFlags
	conn.registerClient(fs)
	var logs logFlags
	logs.register(fs, slog.LevelWarn)
	var cfg synth.Config
	fs.IntVar(&cfg.Nodes, "nodes", 4, "how many nodes")
	fs.IntVar(&cfg.Modules, "modules", 60, "modules per node")
	fs.IntVar(&cfg.Needs, "needs", 25, "needs per module")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "another seed makes another mesh of the same size")
	fs.IntVar(&cfg.Builds, "builds", 0, "percentage of modules between two builds (0-100)")
	fs.IntVar(&cfg.Bound, "bound", 0, "percentage of bound needs their provider has bound; set, the providers declare manifests (0-100)")
	parallel := fs.Int("parallel", 8, "how many node clients write at once")
	return func(ctx context.Context, inv invocation) error {
		if cfg.Nodes < 1 || cfg.Modules < 1 || cfg.Needs < 1 {
			return fmt.Errorf("simulate: --nodes, --modules and --needs must be at least 1")
		}
		if cfg.Builds < 0 || cfg.Builds > 100 || cfg.Bound < 0 || cfg.Bound > 100 {
			return fmt.Errorf("simulate: --builds and --bound are percentages, from 0 to 100")
		}
		nc, ctx, done, err := openClient(ctx, inv, &logs, &conn, "mesh-provisioner simulate", 0)
		if err != nil {
			return err
		}
		defer done()
		watch := nc.violations
		js, err := jetstream.New(nc.Conn)
		if err != nil {
			return err
		}
		start := time.Now()
		mesh := synth.Generate(cfg)
		if err := mesh.Write(ctx, js, *parallel, nil); err != nil {
			return watch.explain(err)
		}
		_, err = fmt.Fprintf(inv.stdout, "wrote %d nodes x %d modules x %d needs (with collection items, applied records and malformed keys) and %d bound keys in %s\n",
			cfg.Nodes, cfg.Modules, cfg.Needs, len(mesh.Bound), time.Since(start).Round(time.Millisecond))
		return err
	}
}

package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/mirror"
)

const captureSynopsis = `Usage: mesh-provisioner capture --out FILE [flags]

Reads every key, value and revision of the five provisioning buckets of a
live mesh, one watcher per bucket, and writes them to FILE as one protobuf
message mesh.provisioner.v1.Capture. The compose benchmark replays it:
MESH_COMPOSE_CAPTURE=FILE make bench.`

func defineCapture(fs *flag.FlagSet) action {
	var conn connectFlags
	conn.registerClient(fs)
	var logs logFlags
	logs.register(fs, slog.LevelWarn)
	out := fs.String("out", "", "the file to write. Required")
	return func(ctx context.Context, inv invocation) error {
		if *out == "" {
			return fmt.Errorf("capture: --out FILE is required")
		}
		nc, ctx, done, err := openClient(ctx, inv, &logs, &conn, "mesh-provisioner capture", 0)
		if err != nil {
			return err
		}
		defer done()
		watch := nc.violations
		js, err := jetstream.New(nc.Conn)
		if err != nil {
			return err
		}
		capture, err := mirror.Capture(ctx, js)
		if err != nil {
			return watch.explain(err)
		}
		data, err := proto.Marshal(capture)
		if err != nil {
			return err
		}
		if err := os.WriteFile(*out, data, 0o644); err != nil {
			return err
		}
		keys := 0
		for _, b := range capture.GetBuckets() {
			keys += len(b.GetEntries())
		}
		_, err = fmt.Fprintf(inv.stdout, "captured %d keys of %d buckets into %s (%d bytes)\n", keys, len(capture.GetBuckets()), *out, len(data))
		return err
	}
}

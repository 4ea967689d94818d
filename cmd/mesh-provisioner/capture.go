package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/service"
)

const captureSynopsis = `Usage: mesh-provisioner capture --out FILE [flags]

Reads every key, value and revision of the four provisioning buckets of a
live mesh, one watcher per bucket, and writes them to FILE as one protobuf
message mesh.provisioner.v1.Capture. The compose benchmark replays it:
MESH_COMPOSE_CAPTURE=FILE make bench.`

func captureCommand(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("mesh-provisioner capture", flag.ContinueOnError)
	var conn connectFlags
	conn.registerClient(fs)
	out := fs.String("out", "", "the file to write. Required")
	if err := parseFlags(fs, args, stderr, captureSynopsis); err != nil {
		return err
	}
	if *out == "" {
		return fmt.Errorf("capture: --out FILE is required")
	}
	nc, err := conn.connectClient("mesh-provisioner capture")
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	capture, err := service.Capture(ctx, js)
	if err != nil {
		return err
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
	_, err = fmt.Fprintf(stdout, "captured %d keys of %d buckets into %s (%d bytes)\n", keys, len(capture.GetBuckets()), *out, len(data))
	return err
}

// Command apply writes one conformance case's bucket writes to a running
// mesh-provisioner and, unless the case says no_wait, waits until the
// server's copy holds them. The TypeScript and Python conformance runners
// call it, so that every language writes a case the same way.
//
//	apply --nats-url nats://127.0.0.1:4222 conformance/cases/NAME.json
//
// It prints the last revision written to each bucket as one JSON object,
// such as {"mesh-provisioner_needs":3}.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/internal/testkit/conformance"
)

func main() {
	url := flag.String("nats-url", "", "URL of the NATS the mesh-provisioner serves on (required)")
	flag.Parse()
	if *url == "" || flag.NArg() != 1 {
		fmt.Fprintln(os.Stderr, "usage: apply --nats-url URL CASE.json")
		os.Exit(2)
	}
	if err := run(*url, flag.Arg(0)); err != nil {
		fmt.Fprintf(os.Stderr, "apply: %v\n", err)
		os.Exit(1)
	}
}

func run(url, file string) error {
	c, err := conformance.LoadFile(file)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(url, nats.Name("mesh-provisioner conformance apply"))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	last, err := conformance.Apply(ctx, nc, c)
	if err != nil {
		return fmt.Errorf("%s: %w", c.Name, err)
	}
	return json.NewEncoder(os.Stdout).Encode(last)
}

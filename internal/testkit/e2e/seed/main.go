// Command seed writes the fixed data set that the TypeScript client's end to
// end test (clients/ts/test/e2e.test.ts) reads back through a running
// mesh-provisioner, then waits until the service's copy holds all of it.
//
//	seed --nats-url nats://127.0.0.1:4222 [--creds node.creds]
//
// Good records are written through package nodeclient, one client per node
// (ace and novox); the malformed keys are written with a raw KV Put, as a
// client that does not check keys would. The buckets must be empty: the test
// gives every run a fresh server. On success seed prints one JSON object on
// stdout, the last revision it wrote to each bucket, such as
//
//	{"mesh-provisioner_applied":4,"mesh-provisioner_collect":8,"mesh-provisioner_needs":13}
//
// The data set, in write order (keys as stored):
//
//	mesh-provisioner_needs
//	  ace.web.port.http            {placeholder: "${port:http}", required: true}
//	  ace.web.config.db_url        {placeholder: "${config:db_url}", required: true}
//	  ace.web.secret.api_token     {placeholder: "${secret:api_token}"}
//	  ace.web.bound.db             {placeholder: "${bound:db}", provider: "postgres",
//	                                provision: "database", local: "web", required: true}
//	  ace.web.shell.zsh=3Anormal   {placeholder: "${shell:zsh:normal}"}   name "zsh:normal", escaped
//	  ace.worker.dir.state         {placeholder: "${dir:state}"}
//	  ace.ml.gpu.cuda              {placeholder: "${gpu:cuda}"}           compose: no domain (kind gpu)
//	  ace.worker.bound.cache       {placeholder: "${bound:cache}", required: true}
//	                                               compose: unfillable (no provider)
//	  novox.api.port.grpc          {placeholder: "${port:grpc}", required: true}
//	  novox.api.collected.plugins  {placeholder: "${collected:plugins}"}
//	  ace.web.port                 "x"             malformed: 3 tokens
//	  ace.worker.port.metrics      ff ff ff        malformed: the value does not decode
//	  novox                        "x"             malformed: 1 token
//
//	mesh-provisioner_applied
//	  ace.web     {plan_digest: "sha256:0a1b", applied_at: 2026-01-02T03:04:05Z,
//	               placeholders: ["${port:http}", "${config:db_url}", "${secret:api_token}", "${bound:db}"]}
//	  ace.worker  {plan_digest: "sha256:2c3d", applied_at: 2026-01-02T03:04:05.5Z,
//	               placeholders: ["${dir:state}"]}
//	  novox.api   {plan_digest: "sha256:4e5f", applied_at: 2026-01-03T00:00:00Z}
//	  novox.api.v2  "x"                            malformed: 3 tokens
//
//	mesh-provisioner_collect (collection shown readable; the key holds it escaped)
//	  ace   shell:zsh:normal  web     {value: "export WEB_PORT=8080", order: 10,
//	                                   attributes: {"source": "web"}}
//	  ace   shell:zsh:normal  worker  {value: "alias w=worker", order: 20}
//	  ace   environment       web     {value: "WEB_ENV=production",
//	                                   attributes: {"scope": "process", "visibility": "public"}}
//	  novox environment       api     {value: "API_ENV=staging", order: -1}
//	  novox shell:zsh:normal  api     {value: "export API=1", order: 5}
//	  novox plugins           auth    {value: "jwt", order: 2}
//	  novox plugins           api     {value: "grpc-health", order: 1,
//	                                   attributes: {"port": "grpc"}}
//	  ace.shell=3a.web  "x"                        malformed: a bad escape
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// catchUpTimeout bounds the wait for the service's copy to hold the writes.
const catchUpTimeout = 10 * time.Second

type need struct {
	node, module, kind, name string
	need                     *provisionerv1.Need
}

type applied struct {
	node, module string
	applied      *provisionerv1.Applied
}

type item struct {
	node, collection, contributor string
	item                          *provisionerv1.CollectItem
}

// rawPut is a key written as is, out of its bucket's shape.
type rawPut struct {
	bucket, key string
	value       []byte
}

var (
	needs = []need{
		{"ace", "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}", Required: true}},
		{"ace", "web", "config", "db_url", &provisionerv1.Need{Placeholder: "${config:db_url}", Required: true}},
		{"ace", "web", "secret", "api_token", &provisionerv1.Need{Placeholder: "${secret:api_token}"}},
		{"ace", "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "postgres", Provision: "database", Local: "web", Required: true}},
		{"ace", "web", "shell", "zsh:normal", &provisionerv1.Need{Placeholder: "${shell:zsh:normal}"}},
		{"ace", "worker", "dir", "state", &provisionerv1.Need{Placeholder: "${dir:state}"}},
		{"ace", "ml", "gpu", "cuda", &provisionerv1.Need{Placeholder: "${gpu:cuda}"}},
		{"ace", "worker", "bound", "cache", &provisionerv1.Need{Placeholder: "${bound:cache}", Required: true}},
		{"novox", "api", "port", "grpc", &provisionerv1.Need{Placeholder: "${port:grpc}", Required: true}},
		{"novox", "api", "collected", "plugins", &provisionerv1.Need{Placeholder: "${collected:plugins}"}},
	}
	applieds = []applied{
		{"ace", "web", &provisionerv1.Applied{
			PlanDigest:   "sha256:0a1b",
			AppliedAt:    timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)),
			Placeholders: []string{"${port:http}", "${config:db_url}", "${secret:api_token}", "${bound:db}"},
		}},
		{"ace", "worker", &provisionerv1.Applied{
			PlanDigest:   "sha256:2c3d",
			AppliedAt:    timestamppb.New(time.Date(2026, 1, 2, 3, 4, 5, 500_000_000, time.UTC)),
			Placeholders: []string{"${dir:state}"},
		}},
		{"novox", "api", &provisionerv1.Applied{
			PlanDigest: "sha256:4e5f",
			AppliedAt:  timestamppb.New(time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)),
		}},
	}
	items = []item{
		{"ace", "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "export WEB_PORT=8080", Order: 10, Attributes: map[string]string{"source": "web"}}},
		{"ace", "shell:zsh:normal", "worker", &provisionerv1.CollectItem{Value: "alias w=worker", Order: 20}},
		{"ace", "environment", "web", &provisionerv1.CollectItem{Value: "WEB_ENV=production", Attributes: map[string]string{"scope": "process", "visibility": "public"}}},
		{"novox", "environment", "api", &provisionerv1.CollectItem{Value: "API_ENV=staging", Order: -1}},
		{"novox", "shell:zsh:normal", "api", &provisionerv1.CollectItem{Value: "export API=1", Order: 5}},
		{"novox", "plugins", "auth", &provisionerv1.CollectItem{Value: "jwt", Order: 2}},
		{"novox", "plugins", "api", &provisionerv1.CollectItem{Value: "grpc-health", Order: 1, Attributes: map[string]string{"port": "grpc"}}},
	}
	malformed = []rawPut{
		{keys.NeedsBucket, "ace.web.port", []byte("x")},
		{keys.NeedsBucket, "ace.worker.port.metrics", []byte{0xff, 0xff, 0xff}},
		{keys.NeedsBucket, "novox", []byte("x")},
		{keys.AppliedBucket, "novox.api.v2", []byte("x")},
		{keys.CollectBucket, "ace.shell=3a.web", []byte("x")},
	}
)

// whatOf names the answer that reads each state bucket.
var whatOf = map[string]provisionerv1.What{
	keys.NeedsBucket:   provisionerv1.What_WHAT_NEEDS,
	keys.AppliedBucket: provisionerv1.What_WHAT_APPLIED,
	keys.CollectBucket: provisionerv1.What_WHAT_COLLECT,
}

func main() {
	url := flag.String("nats-url", "", "URL of the NATS the mesh-provisioner serves on (required)")
	creds := flag.String("creds", "", "NATS credentials file")
	flag.Parse()
	if *url == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: seed --nats-url URL [--creds FILE]")
		os.Exit(2)
	}
	if err := run(*url, *creds); err != nil {
		fmt.Fprintf(os.Stderr, "seed: %v\n", err)
		os.Exit(1)
	}
}

func run(url, creds string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	opts := []nats.Option{nats.Name("mesh-provisioner e2e seed")}
	if creds != "" {
		opts = append(opts, nats.UserCredentials(creds))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()

	last, err := write(ctx, nc)
	if err != nil {
		return err
	}
	if err := waitForCopy(ctx, client.New(nc), last); err != nil {
		return err
	}
	return json.NewEncoder(os.Stdout).Encode(last)
}

// write writes the data set and returns the last revision written to each
// bucket.
func write(ctx context.Context, nc *nats.Conn) (map[string]uint64, error) {
	nodes := map[string]*nodeclient.Client{}
	for _, node := range []string{"ace", "novox"} {
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			return nil, err
		}
		nodes[node] = c
	}
	last := map[string]uint64{}
	for _, n := range needs {
		rev, err := nodes[n.node].PutNeed(ctx, n.module, n.kind, n.name, n.need)
		if err != nil {
			return nil, err
		}
		last[keys.NeedsBucket] = rev
	}
	for _, a := range applieds {
		rev, err := nodes[a.node].PutApplied(ctx, a.module, a.applied)
		if err != nil {
			return nil, err
		}
		last[keys.AppliedBucket] = rev
	}
	for _, i := range items {
		rev, err := nodes[i.node].PutCollectItem(ctx, i.collection, i.contributor, i.item)
		if err != nil {
			return nil, err
		}
		last[keys.CollectBucket] = rev
	}

	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	for _, m := range malformed {
		kv, err := js.KeyValue(ctx, m.bucket)
		if err != nil {
			return nil, fmt.Errorf("bind bucket %s: %w", m.bucket, err)
		}
		rev, err := kv.Put(ctx, m.key, m.value)
		if err != nil {
			return nil, fmt.Errorf("put %s in %s: %w", m.key, m.bucket, err)
		}
		last[m.bucket] = rev
	}
	return last, nil
}

// waitForCopy asks the provisioning verb, bucket by bucket, to answer once
// the service's copy has reached the last revision written to it (read your
// writes), until it does or catchUpTimeout passes. A 503 (the copy is still
// loading, or did not reach the revision within the server's wait) is asked
// again.
func waitForCopy(ctx context.Context, c *client.Client, last map[string]uint64) error {
	ctx, cancel := context.WithTimeout(ctx, catchUpTimeout)
	defer cancel()
	for _, bucket := range slices.Sorted(maps.Keys(last)) {
		rev := last[bucket]
		for {
			answer, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: whatOf[bucket], MinRevision: rev})
			if err == nil {
				if answer.GetRevision() < rev {
					return fmt.Errorf("asked for %s at revision %d or later, the service answered at %d", bucket, rev, answer.GetRevision())
				}
				break
			}
			if ctx.Err() != nil {
				return fmt.Errorf("the service's copy of %s did not reach revision %d within %s: %w", bucket, rev, catchUpTimeout, err)
			}
			if wire.CodeOf(err) != wire.CodeUnavailable {
				return fmt.Errorf("ask for %s: %w", bucket, err)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}

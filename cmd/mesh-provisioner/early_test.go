package main

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// TestTheWriterReadsANodeAloneWithItsGrants: what a lone instance reads to
// answer a node while its copy loads (mirror.ReadNode, and the providers'
// buckets its needs name, which the copy follows), the server's writing
// identity reads with exactly the grants `permissions --server-writer
// --providers pg` prints, on a real authorizing nats-server: the node's
// keys in the three state buckets, nothing of another node's, pg's bucket,
// and no violation but of redis's bucket, which the writer is not granted:
// it reads as the copy holds a bucket it cannot read, behind.
func TestTheWriterReadsANodeAloneWithItsGrants(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	serveAuthorized(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	writeRecordsOf(ctx, t, ace, novox)
	admin := connectAs(t, s, "", "admin")
	needs, err := admin.js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	cache, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${bound:cache}", Provider: "redis", Provision: "cache"})
	if _, err := needs.Put(ctx, "ace.web.bound.cache", cache); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: wire.BoundBucket("pg")}); err != nil {
		t.Fatal(err)
	}
	pg := client.New(connectAs(t, s, wire.RoleProvider, "pg").nc)
	bound, err := pg.Bind(ctx, "pg", "ace.web.database.ace", []byte("postgres://ace"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := pg.Bind(ctx, "pg", "novox.web.database.novox", []byte("postgres://novox")); err != nil {
		t.Fatal(err)
	}

	// A copy of the registry and manifests, loaded, as the lone instance
	// holds them first.
	writer := connectAs(t, s, wire.RoleServer, wire.WriterIdentity)
	copied := mirror.New()
	watchers, err := copied.Open(ctx, writer.js, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { watchers.Run(runCtx); close(done) }()
	t.Cleanup(func() { stop(); <-done })
	for _, c := range []mirror.Watched{copied.Registry, copied.Manifests} {
		select {
		case <-c.Loaded():
		case <-ctx.Done():
			t.Fatalf("the copy of %s did not load", c.Bucket())
		}
	}

	read, err := watchers.ReadNode(ctx, "ace")
	if err != nil {
		t.Fatalf("the writer reads ace alone: %v", err)
	}
	for _, bucket := range []string{wire.BoundBucket("pg"), wire.BoundBucket("redis")} { // as ace's needs name them
		if !read.Bound.Bucket(bucket).WaitLoaded(ctx) {
			t.Fatalf("the copy did not read %s", bucket)
		}
	}
	// A look's first request: a consumer, named anew each time.
	redis := "$JS.API.CONSUMER.CREATE." + wire.StreamOf(wire.BoundBucket("redis")) + "."
	natstest.CheckFor(t, 3*time.Second, func() error {
		writer.mu.Lock()
		defer writer.mu.Unlock()
		if !slices.ContainsFunc(writer.violations, func(v string) bool { return strings.Contains(v, `Publish to "`+redis) }) {
			return fmt.Errorf("nats-server did not refuse the writer a consumer of redis's bucket (%s<name>)", redis)
		}
		return nil
	})
	writer.mu.Lock()
	violations := slices.Clone(writer.violations)
	writer.mu.Unlock()
	for _, v := range violations {
		if !strings.Contains(v, redis) {
			t.Errorf("the writer's read of ace alone broke its grants: %v", v)
		}
	}
	if !read.Bound.Bucket(wire.BoundBucket("redis")).Behind() {
		t.Error("redis's bucket, which the writer may not read, reads as not behind")
	}
	for _, c := range []mirror.Watched{read.Needs, read.Applied, read.Collect} {
		records, _, groups, _ := c.Counts()
		want := map[string]int{keys.NeedsBucket: 3, keys.AppliedBucket: 1, keys.CollectBucket: 1}[c.Bucket()]
		if st, _ := c.Stamp("ace"); groups != 1 || records != want || st == 0 {
			t.Errorf("%s read for ace: %d records in %d nodes, want ace's %d alone", c.Bucket(), records, groups, want)
		}
	}
	if got := read.Bound.Key(wire.BoundBucket("pg"), "ace.web.database.ace"); got != bound {
		t.Errorf("ace's key in pg's bucket read at revision %d, want %d", got, bound)
	}
}

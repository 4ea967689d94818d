package mirror_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
)

// The copy of a provider's bucket: missing, then made and written by the
// provider, read with keys and revisions only; a delete drops the key; a
// wait for a revision of a bucket found missing looks for it again at once;
// Changed says whose keys changed.
func TestBoundFollowsAProvidersBucket(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t)
	pg := b.Bucket("pg_bound")
	if !pg.WaitLoaded(ctx) || pg.Behind() || b.Key("pg_bound", "ace.web.db") != 0 {
		t.Fatalf("a bucket not made yet: loaded %v, behind %v", pg.Loaded(), pg.Behind())
	}
	_, _, mark := b.Changed(0)

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "ace.web.db", []byte("a secret the server never reads"))
	if err != nil {
		t.Fatal(err)
	}
	// Sooner than the 2s a missing bucket waits to be looked for again.
	waitCtx, cancelWait := context.WithTimeout(ctx, time.Second)
	defer cancelWait()
	if !pg.WaitFor(waitCtx, rev) {
		t.Fatalf("the copy did not reach revision %d of a bucket made after it was found missing", rev)
	}
	if got := b.Key("pg_bound", "ace.web.db"); got != rev {
		t.Errorf("ace.web.db at revision %d, want %d", got, rev)
	}
	if firsts, buckets, _ := b.Changed(mark); !slices.Contains(firsts, "ace") || !slices.Contains(buckets, "pg_bound") {
		t.Errorf("changed since the mark: %v in %v, want ace in pg_bound", firsts, buckets)
	}
	if err := kv.Delete(ctx, "ace.web.db"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if got := b.Key("pg_bound", "ace.web.db"); got != 0 {
			return fmt.Errorf("ace.web.db still at %d after its delete", got)
		}
		return nil
	})
	if revs := b.Revisions(); revs["pg_bound"] < rev+1 {
		t.Errorf("revisions %v, want pg_bound past the delete", revs)
	}
}

// A node's stamp of the copy changes with its own keys (those whose first
// token is the node) and with a bucket as a whole, not with another node's
// keys; a wait for a revision returns with the change stamped.
func TestBoundStampOfFollowsANodesOwnKeys(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t)
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "ace.web.db", []byte("v")); err != nil {
		t.Fatal(err)
	}
	pg := b.Bucket("pg_bound")
	if !pg.WaitLoaded(ctx) {
		t.Fatal("pg_bound not loaded")
	}

	type stamps struct{ all, ace, bob uint64 }
	read := func() stamps { return stamps{b.Stamp(), b.StampOf("ace"), b.StampOf("bob")} }
	write := func(key string, del bool) {
		t.Helper()
		var rev uint64
		if del {
			if err := kv.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			st, err := kv.Status(ctx)
			if err != nil {
				t.Fatal(err)
			}
			rev = st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
		} else if rev, err = kv.Put(ctx, key, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if !pg.WaitFor(ctx, rev) {
			t.Fatalf("the copy did not reach revision %d", rev)
		}
	}
	// Which stamps a change changes.
	type changes struct{ all, ace, bob bool }
	steps := []struct {
		name   string
		change func()
		want   changes
	}{
		{"another node's key put", func() { write("bob.api.db", false) }, changes{all: true, bob: true}},
		{"the node's key put again", func() { write("ace.web.db", false) }, changes{all: true, ace: true}},
		{"another node's key deleted", func() { write("bob.api.db", true) }, changes{all: true, bob: true}},
		{"a key of a first token that begins alike", func() { write("acer.web.db", false) }, changes{all: true}},
		{"a bucket named, and found missing", func() {
			if !b.Bucket("redis_bound").WaitLoaded(ctx) {
				t.Fatal("redis_bound not looked for")
			}
		}, changes{all: true, ace: true, bob: true}},
	}
	for _, step := range steps {
		before := read()
		step.change()
		after := read()
		if got := (changes{after.all != before.all, after.ace != before.ace, after.bob != before.bob}); got != step.want {
			t.Errorf("%s: stamps %+v -> %+v; changed %+v, want %+v", step.name, before, after, got, step.want)
		}
	}
}

// runBound starts a copy of the providers' buckets on a server of its own,
// for 20 s at most, and stops it when t ends.
func runBound(t *testing.T) (*mirror.Bound, jetstream.JetStream, context.Context) {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	b := mirror.NewBound()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	done := make(chan struct{})
	go func() { b.Run(ctx, js, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return b, js, ctx
}

// boundPastSlowAPI makes provider's bucket with key in it, and runs a copy
// of the providers' buckets whose JetStream API requests that begin with
// one of slowed are answered late by delay; it returns the copy, the key's
// revision and a context that ends with the test.
func boundPastSlowAPI(t *testing.T, bucket, key string, delay time.Duration, slowed ...string) (*mirror.Bound, uint64, context.Context) {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	direct, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	kv, err := direct.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, key, []byte("a secret the server never reads"))
	if err != nil {
		t.Fatal(err)
	}
	slow, slowing := slowJetStreamAPI(t, nc, delay, slowed...)
	slowing.Store(true)
	b := mirror.NewBound()
	done := make(chan struct{})
	go func() { b.Run(ctx, slow, nil); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
	return b, rev, ctx
}

// A provider's bucket whose consumer nats-server makes late (as it does
// while instances load a large mesh: each of their consumers of millions
// of keys takes its API a second) reads as behind once a look has waited
// apiTimeout, so that answers do not wait for it, and is read by that
// same look when the consumer comes: a look given up and sent again would
// queue behind itself.
func TestBoundReadsABucketItsLookWaitedFor(t *testing.T) {
	t.Parallel()
	// The look's consumer 1.5s late: more than the second the answers
	// wait.
	b, rev, ctx := boundPastSlowAPI(t, "pg_bound", "ace.web.db", 1500*time.Millisecond, "CONSUMER.CREATE.")
	named := time.Now()
	pg := b.Bucket("pg_bound")
	waitCtx, cancelWait := context.WithTimeout(ctx, 1500*time.Millisecond)
	defer cancelWait()
	if !pg.WaitLoaded(waitCtx) || !pg.Behind() {
		t.Fatalf("1.5s after it was named, with its look unanswered: loaded %v, behind %v; want answers no longer waiting, told it is behind", pg.Loaded(), pg.Behind())
	}
	readCtx, cancelRead := context.WithTimeout(ctx, 8*time.Second)
	defer cancelRead()
	if !pg.WaitFor(readCtx, rev) || pg.Behind() || b.Key("pg_bound", "ace.web.db") != rev {
		t.Fatalf("8s after it was named: behind %v, ace.web.db at revision %d; want %d", pg.Behind(), b.Key("pg_bound", "ace.web.db"), rev)
	}
	t.Logf("read %v after it was named", time.Since(named).Round(time.Millisecond))
}

// A look at a provider's bucket asks nats-server for no stream info
// before the bucket's keys are in: nats-server answers stream infos only
// when no other JetStream API request waits, and while instances made
// consumers of a large mesh's keys, every node's answer said the bucket
// was behind for up to 30 s (bench-scale). With stream infos 10 s late,
// the keys are read within a second, and the bucket is not behind.
func TestBoundLooksAskNoStreamInfoBeforeTheKeys(t *testing.T) {
	t.Parallel()
	b, rev, ctx := boundPastSlowAPI(t, "redis_bound", "ace.web.cache", 10*time.Second, "STREAM.INFO.")
	named := time.Now()
	redis := b.Bucket("redis_bound")
	readCtx, cancelRead := context.WithTimeout(ctx, time.Second)
	defer cancelRead()
	if !redis.WaitFor(readCtx, rev) || redis.Behind() {
		t.Fatalf("1s after it was named, with stream infos 10s late: behind %v, ace.web.cache at revision %d; want %d", redis.Behind(), b.Key("redis_bound", "ace.web.cache"), rev)
	}
	t.Logf("read %v after it was named", time.Since(named).Round(time.Millisecond))
}

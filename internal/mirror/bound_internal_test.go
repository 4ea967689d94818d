package mirror

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"runtime"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
)

// Looks for providers' buckets are bounded across every bucket named: a
// node that names a provider in each of its keys, none of whose buckets
// exist, has the server ask about them at the bound's rate, not about each
// every boundRetry. Each bucket is still found missing, and its
// provisions pending.
func TestBoundLooksForBucketsAtABoundedRate(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	asked := countRequests(t, srv, "$JS.API.CONSUMER.CREATE.>") // a look's one request

	const named, perSecond, burst = 200, 20, 20
	b := NewBound()
	b.lookups = rate.NewLimiter(perSecond, burst)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, js, nil) }()
	defer func() { cancel(); <-done }()
	began := time.Now()
	for i := range named {
		b.Bucket(fmt.Sprintf("p%03d_bound", i))
	}
	// Watched until the looks go on past the burst, at the bound's rate
	// (on Run's next tick, boundRetry on), and the buckets looked for in
	// turn are found missing, their provisions pending.
	loaded := func() int {
		n := 0
		for i := range named {
			if b.Bucket(fmt.Sprintf("p%03d_bound", i)).Loaded() {
				n++
			}
		}
		return n
	}
	natstest.CheckFor(t, 30*time.Second, func() error {
		if n, l := asked(), loaded(); n <= burst || l < burst {
			return fmt.Errorf("the server was asked %d times, and %d of %d buckets were found missing; want more than the burst of %d, and at least as many", n, l, named, burst)
		}
		return nil
	})
	n := asked()
	took := time.Since(began)
	most := burst + int64(perSecond*took.Seconds()) + 1
	t.Logf("the server was asked %d times in %s; the bound allows %d", n, took.Round(time.Millisecond), most)
	if n > most {
		t.Errorf("%d buckets named, none made: the server was asked about them %d times in %s, more than the %d the bound allows", named, n, took.Round(time.Millisecond), most)
	}
}

// A bucket not followed (missing here) that nothing names any more is
// forgotten, its follower ended: a node that names a new provider in key
// after key leaves nothing behind. One still named is kept, and one
// forgotten and then named again is looked for anew.
func TestBoundForgetsBucketsNothingNames(t *testing.T) {
	t.Parallel()
	b, _, ctx := runBound(t, func(b *Bound) {
		b.retry, b.forget = 20*time.Millisecond, 200*time.Millisecond
	})

	const named = 30
	for i := range named {
		b.Bucket(fmt.Sprintf("p%03d_bound", i))
	}
	kept := b.Bucket("kept_bound")
	stop := make(chan struct{})
	naming := make(chan struct{})
	go func() { // a node still composed, naming its provider's bucket
		defer close(naming)
		for {
			select {
			case <-stop:
				return
			case <-time.After(10 * time.Millisecond):
				b.Bucket("kept_bound")
			}
		}
	}()
	natstest.CheckFor(t, 10*time.Second, func() error {
		if n, _ := b.Counts(); n != 1 {
			return fmt.Errorf("%d buckets held, want only kept_bound", n)
		}
		return nil
	})
	close(stop)
	<-naming
	if b.Bucket("kept_bound") != kept {
		t.Error("kept_bound, named all along, was forgotten")
	}
	again := b.Bucket("p000_bound")
	wait, cancelWait := context.WithTimeout(ctx, 5*time.Second)
	defer cancelWait()
	if !again.WaitLoaded(wait) {
		t.Error("p000_bound, named again once forgotten, was not looked for")
	}
}

// A node that names many providers whose buckets do not exist costs the
// copy an entry for each, not a goroutine: once each is found missing, no
// goroutine looks for or follows any of them until it is looked for again.
func TestBoundHoldsNoGoroutineForAMissingBucket(t *testing.T) {
	// Not parallel: it counts the followers of the whole process.
	b, _, _ := runBound(t, func(b *Bound) {
		b.lookups = rate.NewLimiter(rate.Inf, 0)
		b.retry = time.Minute // looked for once in this test
	})

	const named = 300
	for i := range named {
		b.Bucket(fmt.Sprintf("m%03d_bound", i))
	}
	natstest.CheckFor(t, 10*time.Second, func() error {
		if behind := b.Behind(); len(behind) > 0 {
			return fmt.Errorf("%d of %d buckets not looked for yet", len(behind), named)
		}
		return nil
	})
	natstest.CheckFor(t, 5*time.Second, func() error {
		if n := followers(); n > 0 {
			return fmt.Errorf("%d goroutines look for or follow buckets found missing", n)
		}
		return nil
	})
}

// followers counts the goroutines in BoundBucket.follow.
func followers() int {
	buf := make([]byte, 1<<20)
	for {
		n := runtime.Stack(buf, true)
		if n < len(buf) {
			return strings.Count(string(buf[:n]), "mirror.(*BoundBucket).follow(")
		}
		buf = make([]byte, 2*len(buf))
	}
}

// A wait on a bucket the copy forgot since does not make the copy follow
// it: only the bucket its name makes anew is followed.
func TestBoundFollowsNoBucketItForgot(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t, func(b *Bound) {
		b.retry, b.forget = 20*time.Millisecond, 100*time.Millisecond
	})

	stale := b.Bucket("late_bound")
	natstest.CheckFor(t, 10*time.Second, func() error {
		if n, _ := b.Counts(); n > 0 {
			return errors.New("late_bound not forgotten yet")
		}
		return nil
	})
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "late_bound"})
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "ace.web.db", []byte("v"))
	if err != nil {
		t.Fatal(err)
	}
	wait, cancelWait := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancelWait()
	if stale.WaitFor(wait, rev) {
		t.Error("the forgotten bucket was followed again")
	}
	fresh := b.Bucket("late_bound")
	if fresh == stale {
		t.Fatal("late_bound named again is the forgotten one")
	}
	wait, cancelWait = context.WithTimeout(ctx, 5*time.Second)
	defer cancelWait()
	if !fresh.WaitFor(wait, rev) {
		t.Errorf("late_bound, named again, did not reach revision %d", rev)
	}
}

// A provider's bucket deleted holds nothing any more: its keys are dropped
// (its provisions pending again). Made again, it is read anew, from its
// own first revision.
func TestBoundFollowsABucketDeletedAndMadeAgain(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t, func(b *Bound) {
		b.retry = 20 * time.Millisecond // checked every 300ms
	})

	bind := func(keys ...string) (rev uint64) {
		t.Helper()
		// Made again right after its delete, the stream's store may still
		// be going: the server says so, and is asked again.
		var kv jetstream.KeyValue
		natstest.CheckFor(t, 5*time.Second, func() (err error) {
			kv, err = js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
			return err
		})
		for _, key := range keys {
			var err error
			if rev, err = kv.Put(ctx, key, []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
		return rev
	}
	held := func(want map[string]uint64) func() error { return holds(b, "pg_bound", want) }
	bind("ace.web.db", "ace.web.cache", "bob.api.db")
	natstest.CheckFor(t, 5*time.Second, held(map[string]uint64{"ace.web.db": 1, "ace.web.cache": 2, "bob.api.db": 3}))
	ace := b.StampOf("ace")

	if err := js.DeleteKeyValue(ctx, "pg_bound"); err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, held(map[string]uint64{}))
	if b.StampOf("ace") == ace {
		t.Error("ace's stamp did not change with its keys dropped")
	}
	if rev := b.Bucket("pg_bound").Revision(); rev != 0 {
		t.Errorf("a bucket deleted is at revision %d, want 0", rev)
	}

	bind("bob.api.db")
	natstest.CheckFor(t, 5*time.Second, held(map[string]uint64{"bob.api.db": 1}))

	// Deleted and made again between two checks.
	if err := js.DeleteKeyValue(ctx, "pg_bound"); err != nil {
		t.Fatal(err)
	}
	bind("carl.db.db")
	natstest.CheckFor(t, 5*time.Second, held(map[string]uint64{"carl.db.db": 1}))
}

// A provider's bucket that holds more keys than the copy's bound is not
// held: its keys are dropped (its provisions pending) and it reads as
// failing, whether it held them when first read or came to; once it holds
// fewer, it is followed again.
func TestBoundHoldsNoBucketOverItsBound(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t, func(b *Bound) {
		b.retry = 20 * time.Millisecond // a bucket over the bound looked for every 300ms
		b.SetMaxKeys(3)
	})

	put := func(kv jetstream.KeyValue, keys ...string) {
		t.Helper()
		for _, key := range keys {
			if _, err := kv.Put(ctx, key, []byte("v")); err != nil {
				t.Fatal(err)
			}
		}
	}
	// holds waits until bucket holds n keys and is failing or not.
	holds := func(bucket string, n int, failing bool) {
		t.Helper()
		natstest.CheckFor(t, 5*time.Second, func() error {
			bb := b.Bucket(bucket)
			if got := len(bb.Keys()); got != n || bb.Behind() != failing {
				return fmt.Errorf("%s holds %d keys, behind %v; want %d, %v", bucket, got, bb.Behind(), n, failing)
			}
			return nil
		})
	}
	pg, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	put(pg, "a.m.p", "b.m.p")
	holds("pg_bound", 2, false)
	put(pg, "c.m.p", "d.m.p")
	holds("pg_bound", 0, true)
	if err := pg.Delete(ctx, "d.m.p"); err != nil {
		t.Fatal(err)
	}
	holds("pg_bound", 3, false)

	big, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "big_bound"})
	if err != nil {
		t.Fatal(err)
	}
	put(big, "a.m.p", "b.m.p", "c.m.p", "d.m.p", "e.m.p")
	holds("big_bound", 0, true)
}

// Only the first tokens of nodes with needs are remembered: a provider
// writing and deleting keys of ever new first tokens leaves nothing behind,
// while a node's own keys still move its stamp.
func TestBoundRemembersTheFirstTokensOfNodesOnly(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t, func(b *Bound) {
		b.isNode = func(first string) bool { return first == "ace" }
	})

	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	pg := b.Bucket("pg_bound")
	if !pg.WaitLoaded(ctx) {
		t.Fatal("pg_bound not read")
	}
	ace := b.StampOf("ace")
	var rev uint64
	for i := range 20 {
		key := fmt.Sprintf("n%02d.m.p", i)
		if _, err := kv.Put(ctx, key, []byte("v")); err != nil {
			t.Fatal(err)
		}
		if err := kv.Delete(ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	if rev, err = kv.Put(ctx, "ace.m.p", []byte("v")); err != nil {
		t.Fatal(err)
	}
	if !pg.WaitFor(ctx, rev) {
		t.Fatal("pg_bound not read")
	}
	b.changedMu.RLock()
	remembered := slices.Collect(maps.Keys(b.changed))
	b.changedMu.RUnlock()
	if !slices.Equal(remembered, []string{"ace"}) {
		t.Errorf("first tokens remembered: %v, want [ace]", remembered)
	}
	if b.StampOf("ace") == ace {
		t.Error("ace's stamp did not move with its key")
	}
}

// A mirror's copy of the providers' buckets takes a node to be one with
// needs in the mirror.
func TestMirrorsNodesAreThoseWithNeeds(t *testing.T) {
	t.Parallel()
	m, err := Load(&provisionerv1.Capture{Buckets: []*provisionerv1.CapturedBucket{
		{Bucket: keys.NeedsBucket, Entries: []*provisionerv1.CapturedEntry{{Key: "ace.web.port.http", Revision: 1}}},
		{Bucket: keys.AppliedBucket, Entries: []*provisionerv1.CapturedEntry{{Key: "bob.web", Revision: 1}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for first, want := range map[string]bool{"ace": true, "bob": false, "zed": false} {
		if got := m.Bound.isNode(first); got != want {
			t.Errorf("isNode(%q) = %v, want %v", first, got, want)
		}
	}
}

// runBound starts a copy of the providers' buckets, made as configure says,
// on a server of its own, and stops it when t ends.
func runBound(t *testing.T, configure func(*Bound)) (*Bound, jetstream.JetStream, context.Context) {
	t.Helper()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	b := NewBound()
	if configure != nil {
		configure(b)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, js, nil) }()
	t.Cleanup(func() { cancel(); <-done })
	return b, js, ctx
}

// A bucket over the bound is looked at again no sooner for a wait on it:
// each look reads as many keys as the bound, and a node may ask again and
// again.
func TestBoundLooksAtABucketOverItsBoundNoSoonerForAWait(t *testing.T) {
	t.Parallel()
	srv := natstest.Start(t)
	js, err := jetstream.New(natstest.Connect(t, srv))
	if err != nil {
		t.Fatal(err)
	}
	looks := countRequests(t, srv, "$JS.API.STREAM.INFO.KV_big_bound")
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: "big_bound"})
	if err != nil {
		t.Fatal(err)
	}
	var rev uint64
	for _, key := range []string{"a.m.p", "b.m.p", "c.m.p"} {
		if rev, err = kv.Put(t.Context(), key, []byte("v")); err != nil {
			t.Fatal(err)
		}
	}
	b := NewBound()
	b.SetMaxKeys(2)
	b.retry = time.Second // looked at again after 15s
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx, js, nil) }()
	defer func() { cancel(); <-done }()
	big := b.Bucket("big_bound")
	natstest.CheckFor(t, 5*time.Second, func() error {
		if !big.Loaded() || !big.Behind() {
			return errors.New("big_bound not found over its bound yet")
		}
		return nil
	})
	first := looks()
	for range 50 { // a node asking again and again for its revision
		wait, cancelWait := context.WithTimeout(ctx, 5*time.Millisecond)
		big.WaitFor(wait, rev)
		cancelWait()
	}
	if more := looks() - first; more > 0 {
		t.Errorf("50 waits on a bucket over its bound: looked at %d times more, want none before 15s", more)
	}
}

// countRequests counts the requests on subject that srv's account sends,
// the copy's too: what it returns flushes first, so that each request sent
// before it is counted.
func countRequests(t *testing.T, srv *server.Server, subject string) func() int64 {
	t.Helper()
	spy := natstest.Connect(t, srv)
	var n atomic.Int64
	if _, err := spy.Subscribe(subject, func(*nats.Msg) { n.Add(1) }); err != nil {
		t.Fatal(err)
	}
	if err := spy.Flush(); err != nil {
		t.Fatal(err)
	}
	return func() int64 {
		if err := spy.Flush(); err != nil {
			t.Fatal(err)
		}
		return n.Load()
	}
}

// A watcher whose consumer stops delivering while the bucket is written to
// (paused here: no fault stalls one on cue) is started again: the
// bucket's last revision moved between two checks, the copy's did not.
func TestBoundFollowsABucketWhoseWatcherStalled(t *testing.T) {
	t.Parallel()
	b, js, ctx := runBound(t, func(b *Bound) {
		b.retry = 20 * time.Millisecond // checked every 300ms
	})
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"})
	if err != nil {
		t.Fatal(err)
	}
	put := func(key string) uint64 {
		t.Helper()
		rev, err := kv.Put(ctx, key, []byte("v"))
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	held := func(want map[string]uint64) func() error { return holds(b, "pg_bound", want) }
	first := put("ace.web.db")
	natstest.CheckFor(t, 5*time.Second, held(map[string]uint64{"ace.web.db": first}))

	stream, err := js.Stream(ctx, "KV_pg_bound")
	if err != nil {
		t.Fatal(err)
	}
	paused := 0
	for name := range stream.ConsumerNames(ctx).Name() {
		if _, err := js.PauseConsumer(ctx, "KV_pg_bound", name, time.Now().Add(time.Hour)); err != nil {
			t.Fatal(err)
		}
		paused++
	}
	if paused != 1 {
		t.Fatalf("paused %d consumers of pg_bound, want its watcher's", paused)
	}
	second := put("ace.web.cache")
	natstest.CheckFor(t, 5*time.Second, held(map[string]uint64{"ace.web.db": first, "ace.web.cache": second}))
}

// holds checks, for natstest.CheckFor, that the copy holds want of bucket.
func holds(b *Bound, bucket string, want map[string]uint64) func() error {
	return func() error {
		if got := b.Bucket(bucket).Keys(); !maps.Equal(got, want) {
			return fmt.Errorf("%s holds %v, want %v", bucket, got, want)
		}
		return nil
	}
}

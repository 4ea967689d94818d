package mirror_test

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

type fixture struct {
	js    jetstream.JetStream
	needs jetstream.KeyValue
	m     *mirror.Mirror
	w     *mirror.Watchers
	log   *testlog.Buffer
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	needs, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	log := &testlog.Buffer{}
	m := mirror.New()
	w, err := m.Open(ctx, js, slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelInfo})))
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{js: js, needs: needs, m: m, w: w, log: log}
}

// run runs the watchers until the returned stop is called.
func (f *fixture) run(t *testing.T) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { f.w.Run(ctx); close(done) }()
	select {
	case <-f.m.Needs.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the copy did not load")
	}
	stop = func() { cancel(); <-done }
	t.Cleanup(stop)
	return stop
}

func (f *fixture) put(t *testing.T, key string) uint64 {
	t.Helper()
	value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:x}"})
	rev, err := f.needs.Put(context.Background(), key, value)
	if err != nil {
		t.Fatal(err)
	}
	return rev
}

// reached waits until the needs copy reaches revision.
func (f *fixture) reached(t *testing.T, revision uint64, within time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	if !f.m.Needs.WaitFor(ctx, revision) {
		t.Fatalf("the copy is at revision %d, not %d, after %s", f.m.Needs.Revision(), revision, within)
	}
}

// eachConsumer calls do with the name of each consumer of the needs'
// stream: the watcher's.
func (f *fixture) eachConsumer(t *testing.T, do func(name string) error) {
	t.Helper()
	stream, err := f.js.Stream(context.Background(), "KV_"+keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	for name := range stream.ConsumerNames(context.Background()).Name() {
		if err := do(name); err != nil {
			t.Fatal(err)
		}
	}
}

// caughtUp waits until the needs copy is no longer behind and the log says
// it caught up, after what happened to its watcher.
func (f *fixture) caughtUp(t *testing.T, after string) {
	t.Helper()
	natstest.CheckFor(t, 5*time.Second, func() error {
		if f.m.Needs.Behind() || !strings.Contains(f.log.String(), "bucket copy caught up") {
			return fmt.Errorf("the copy is still behind after %s; log:\n%s", after, f.log)
		}
		return nil
	})
}

func (f *fixture) keys() []string {
	entries, _ := f.m.Needs.All()
	var out []string
	for _, e := range entries {
		out = append(out, e.Key)
	}
	return out
}

func TestWatcherResumesWhenItsConsumerIsDeleted(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.run(t)
	f.reached(t, f.put(t, "a.web.port.http"), 5*time.Second)

	stream, err := f.js.Stream(context.Background(), "KV_"+keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	f.eachConsumer(t, func(name string) error { return stream.DeleteConsumer(context.Background(), name) })
	rev := f.put(t, "b.web.port.http")
	f.reached(t, rev, 2*time.Second)
	if got := f.keys(); !slices.Equal(got, []string{"a.web.port.http", "b.web.port.http"}) {
		t.Errorf("keys %v", got)
	}
	f.caughtUp(t, "its consumer was deleted")
	if !strings.Contains(f.log.String(), "bucket copy may be behind") {
		t.Errorf("the log does not say the copy fell behind:\n%s", f.log)
	}
}

// While no watcher runs, keys are put, deleted and purged: the next
// watcher resumes from the copy's revision and the copy ends equal to the
// bucket.
func TestWatcherResumesFromTheCopysRevision(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	stop := f.run(t)
	for _, k := range []string{"a.web.port.http", "b.web.port.http", "c.web.port.http"} {
		f.put(t, k)
	}
	f.reached(t, f.put(t, "d.web.port.http"), 5*time.Second)
	stop()

	ctx := context.Background()
	if err := f.needs.Delete(ctx, "a.web.port.http"); err != nil {
		t.Fatal(err)
	}
	if err := f.needs.Delete(ctx, "b.web.port.http"); err != nil {
		t.Fatal(err)
	}
	f.put(t, "c.web.port.http")
	last := f.put(t, "e.web.port.http")

	f.run(t)
	f.reached(t, last, 5*time.Second)
	if got, want := f.keys(), []string{"c.web.port.http", "d.web.port.http", "e.web.port.http"}; !slices.Equal(got, want) {
		t.Errorf("keys %v, want %v", got, want)
	}
	if strings.Contains(f.log.String(), "reading every key again") {
		t.Errorf("the watcher read everything again rather than resume:\n%s", f.log)
	}
}

// When the bucket no longer holds the changes after the copy's revision
// (its stream purged meanwhile, after a change the copy never saw), the
// watcher reads every key again and drops the keys that are gone.
func TestWatcherReadsEverythingWhenChangesAreGone(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	natstest.MakePurgeable(context.Background(), t, f.js, "KV_"+keys.NeedsBucket) // the state buckets refuse purges
	stop := f.run(t)
	f.put(t, "a.web.port.http")
	f.reached(t, f.put(t, "b.web.port.http"), 5*time.Second)
	stop()

	ctx := context.Background()
	stream, err := f.js.Stream(ctx, "KV_"+keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	f.put(t, "c.web.port.http")
	if err := stream.Purge(ctx); err != nil {
		t.Fatal(err)
	}
	last := f.put(t, "d.web.port.http")

	f.run(t)
	f.reached(t, last, 5*time.Second)
	want := []string{"d.web.port.http"}
	natstest.CheckFor(t, 5*time.Second, func() error {
		if got := f.keys(); !slices.Equal(got, want) {
			return fmt.Errorf("keys %v, want %v; log:\n%s", got, want, f.log)
		}
		return nil
	})
}

// A watcher whose consumer stops delivering while the bucket is written to
// (paused here: no fault stalls one on cue) is noticed, and the copy
// catches up.
func TestWatcherResumesWhenItsConsumerStalls(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.run(t)
	f.reached(t, f.put(t, "a.web.port.http"), 5*time.Second)

	f.eachConsumer(t, func(name string) error {
		_, err := f.js.PauseConsumer(context.Background(), "KV_"+keys.NeedsBucket, name, time.Now().Add(time.Hour))
		return err
	})
	f.reached(t, f.put(t, "b.web.port.http"), 10*time.Second)
	f.caughtUp(t, "its watcher stalled")
	if !strings.Contains(f.log.String(), "its watcher stalled") {
		t.Errorf("the log does not say the watcher stalled:\n%s", f.log)
	}
}

// The large buckets' watchers wait for the registry's and the manifests'
// copies before they start, but no longer than smallFirst: a registry its
// identity may not read (nats-server refuses the consumer) holds no other
// bucket's copy back for good.
func TestWatchersStartTheLargeBucketsWithoutTheRegistry(t *testing.T) {
	t.Parallel()
	s := natstest.StartDenying(t, "svc", "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_registry", "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_registry.>",
		"$JS.API.DIRECT.GET.KV_mesh-provisioner_registry")
	admin, err := jetstream.New(natstest.Connect(t, s, nats.UserInfo("admin", "admin")))
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(context.Background(), admin, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(natstest.Connect(t, s, nats.UserInfo("svc", "svc"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})))
	if err != nil {
		t.Fatal(err)
	}
	m := mirror.New()
	w, err := m.Open(context.Background(), js, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	runWatchers(t, w)
	select {
	case <-m.Needs.Loaded():
	case <-time.After(10 * time.Second):
		t.Fatal("the needs' copy did not load while the registry's could not")
	}
	if m.Registry.Ready() {
		t.Error("the registry's copy loaded: the test wants it refused")
	}
}

// runWatchers runs w until the test ends.
func runWatchers(t *testing.T, w *mirror.Watchers) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { w.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

// A nats-server slower to answer its JetStream API than a watcher's first
// patience (as one is while it lists millions of keys' last messages for
// other consumers) is waited on longer by each attempt after one that
// timed out: the copy loads, and a Hold's read is done, rather than every
// attempt given up and sent again behind its own earlier copy.
func TestWatchersWaitLongerOnASlowJetStreamAPI(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	layout := buckets.Config{Partitions: meshPartitions}
	nc, direct := bucketsOn(t, layout)
	needs, err := direct.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	data, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	for _, key := range []string{"ace.web.port.http", "bob.web.port.http"} {
		if _, err := needs.Put(ctx, key, data); err != nil {
			t.Fatal(err)
		}
	}

	// Every consumer is made 1.2s late, once the watchers are open: later
	// than a first attempt waits.
	const delay = 1200 * time.Millisecond
	slow, slowing := slowJetStreamAPI(t, nc, delay, "CONSUMER.CREATE.")
	m := mirror.New()
	m.SetHolds(heldOf("ace"))
	w, err := m.Open(ctx, slow, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	slowing.Store(true)
	runWatchers(t, w)
	select {
	case <-m.Needs.Loaded():
	case <-time.After(30 * time.Second):
		t.Fatalf("the needs' copy did not load within 30s with the API answering %s late", delay)
	}
	select {
	case <-w.Hold(heldOf("ace", "bob")):
	case <-time.After(30 * time.Second):
		t.Fatalf("the copy did not hold bob within 30s with the API answering %s late", delay)
	}
	if entries, _, _ := m.Needs.Group("bob"); len(entries) != 1 {
		t.Errorf("bob's needs once held: %d, want 1", len(entries))
	}
}

// slowJetStreamAPI returns a JetStream client of nc whose API requests go
// through a relay that hands those whose subject (after the API prefix)
// starts with one of slowed to nats-server delay late once slowing is set,
// and the others at once; the server answers each on its own reply
// subject.
func slowJetStreamAPI(t *testing.T, nc *nats.Conn, delay time.Duration, slowed ...string) (js jetstream.JetStream, slowing *atomic.Bool) {
	t.Helper()
	const prefix = "slow.API."
	slowing = &atomic.Bool{}
	sub, err := nc.Subscribe(prefix+">", func(msg *nats.Msg) {
		rest := strings.TrimPrefix(msg.Subject, prefix)
		relay := func() {
			_ = nc.PublishMsg(&nats.Msg{Subject: jetstream.DefaultAPIPrefix + rest, Reply: msg.Reply, Header: msg.Header, Data: msg.Data})
		}
		if slowing.Load() && slices.ContainsFunc(slowed, func(s string) bool { return strings.HasPrefix(rest, s) }) {
			time.AfterFunc(delay, relay)
			return
		}
		relay()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	js, err = jetstream.NewWithAPIPrefix(nc, strings.TrimSuffix(prefix, "."))
	if err != nil {
		t.Fatal(err)
	}
	return js, slowing
}

// A copy's first read of a bucket it holds whole asks nothing of the
// stream's state, which nats-server answers last while it has other API
// requests (as while instances load a large mesh): every copy loads with
// stream infos answered 3 s late, later than a read waits for one.
func TestFirstReadsWaitForNoStreamInfo(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, direct := bucketsOn(t, buckets.Config{})
	data, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	for _, bucket := range keys.Buckets() {
		kv, err := direct.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "ace.web.port.http", data); err != nil {
			t.Fatal(err)
		}
	}
	slow, slowing := slowJetStreamAPI(t, nc, 3*time.Second, "STREAM.INFO.")
	m := mirror.New()
	w, err := m.Open(ctx, slow, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	slowing.Store(true)
	opened := time.Now()
	runWatchers(t, w)
	for _, c := range m.Copies() {
		select {
		case <-c.Loaded():
		case <-time.After(2500 * time.Millisecond):
			t.Fatalf("the copy of %s did not load within 2.5s with stream infos answered 3s late", c.Bucket())
		}
		if c.Revision() == 0 {
			t.Errorf("the copy of %s loaded at revision 0", c.Bucket())
		}
	}
	t.Logf("every copy loaded %v after the watchers started", time.Since(opened).Round(time.Millisecond))
}

// The registry's and the manifests' copies, which an instance needs to
// answer anything, first read their buckets by one batch direct get, which
// nats-server answers at once: they load with every JetStream API request
// (stream infos, consumers) answered 5 s late, as while other instances
// make consumers of a large mesh's keys. The registry's copy holds the
// bucket's last values (a key deleted is not) as of the stream's last
// message, the seat's lease, which is no key; the manifests', of an empty
// bucket, nothing, at revision 0. The changes after each follow.
func TestTheRegistryAndTheManifestsLoadPastASlowJetStreamAPI(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, direct := bucketsOn(t, buckets.Config{})
	slow, slowing := slowJetStreamAPI(t, nc, 5*time.Second, "STREAM.INFO.", "CONSUMER.CREATE.")
	m := mirror.New()
	copies := map[string]mirror.Watched{keys.RegistryBucket: m.Registry, keys.ManifestsBucket: m.Manifests}
	data, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	put := func(bucket, key string) uint64 {
		t.Helper()
		kv, err := direct.KeyValue(ctx, bucket)
		if err != nil {
			t.Fatal(err)
		}
		revision, err := kv.Put(ctx, key, data)
		if err != nil {
			t.Fatal(err)
		}
		return revision
	}
	put(keys.RegistryBucket, "ace.kept")
	put(keys.RegistryBucket, "ace.deleted")
	registry, err := direct.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		t.Fatal(err)
	}
	if err := registry.Delete(ctx, "ace.deleted"); err != nil {
		t.Fatal(err)
	}
	put(keys.RegistryBucket, "bob.kept")
	lease, err := direct.Publish(ctx, wire.SeatSubject, []byte("a lease"))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]uint64{keys.RegistryBucket: lease.Sequence, keys.ManifestsBucket: 0}

	w, err := m.Open(ctx, slow, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	slowing.Store(true)
	runWatchers(t, w)
	held := map[string]func(first string) int{
		keys.RegistryBucket:  func(first string) int { entries, _, _ := m.Registry.Group(first); return len(entries) },
		keys.ManifestsBucket: func(first string) int { entries, _, _ := m.Manifests.Group(first); return len(entries) },
	}
	for bucket, c := range copies {
		select {
		case <-c.Loaded():
		case <-time.After(2 * time.Second):
			t.Fatalf("the copy of %s did not load within 2s with the JetStream API answering 5s late", bucket)
		}
		if got := c.Revision(); got != want[bucket] {
			t.Errorf("the copy of %s loaded at revision %d, want %d", bucket, got, want[bucket])
		}
	}
	if ace, bob := held[keys.RegistryBucket]("ace"), held[keys.RegistryBucket]("bob"); ace != 1 || bob != 1 {
		t.Errorf("the registry's copy holds %d keys of ace and %d of bob, want 1 each: those not deleted", ace, bob)
	}

	// The consumer that follows each bucket starts after the revision read.
	slowing.Store(false)
	for bucket, c := range copies {
		later := put(bucket, "cid.later")
		waitCtx, cancel := context.WithTimeout(ctx, 15*time.Second)
		reached := c.WaitFor(waitCtx, later)
		cancel()
		if !reached || held[bucket]("cid") != 1 {
			t.Errorf("the copy of %s did not follow the bucket to revision %d, and the key written there: at %d", bucket, later, c.Revision())
		}
	}
}

// The large buckets' consumers are asked for once the registry's and the
// manifests' copies are loaded and their consumers made (within
// smallFirst), not as soon as the direct gets have loaded them: asked
// after the large buckets' consumers of millions of keys, each a second
// of nats-server's API, the registry's timed out, and answers said its
// copy was behind. With the registry's consumer made 500 ms late, the
// needs' is asked for after it.
func TestTheLargeBucketsWaitForTheRegistrysConsumer(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	nc, direct := bucketsOn(t, buckets.Config{})
	registry, err := direct.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := registry.Put(ctx, "port", []byte("a record")); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var asked []string // the consumers asked of nats-server, by stream, in order
	sub, err := nc.Subscribe("$JS.API.CONSUMER.CREATE.>", func(msg *nats.Msg) {
		mu.Lock()
		asked = append(asked, strings.Split(msg.Subject, ".")[4])
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
	slow, slowing := slowJetStreamAPI(t, nc, 500*time.Millisecond, "CONSUMER.CREATE."+wire.StreamOf(keys.RegistryBucket))
	slowing.Store(true)
	m := mirror.New()
	w, err := m.Open(ctx, slow, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	runWatchers(t, w)
	waitLoaded(t, m.Needs)
	mu.Lock()
	defer mu.Unlock()
	first := func(stream string) int { return slices.Index(asked, stream) }
	if r, n := first(wire.StreamOf(keys.RegistryBucket)), first(wire.StreamOf(keys.NeedsBucket)); r < 0 || n < r {
		t.Errorf("consumers asked for, in order: %q; want the registry's before the needs'", asked)
	}
}

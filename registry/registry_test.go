package registry_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
)

func TestTableAnswersEveryKind(t *testing.T) {
	t.Parallel()
	if err := registry.Validate(registry.Table()); err != nil {
		t.Fatal(err)
	}
	got := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		got[e.GetKind()] = e
	}
	for _, kind := range []string{"config", "secret", "bound", "consumers", "collected", "shell", "environment", "contribution", "dir", "access", "port", "seat", "machine"} {
		if got[kind] == nil {
			t.Errorf("no entry answers kind %q", kind)
		}
	}
	for _, kind := range registry.SecretKinds {
		if got[kind].GetVerb() == nil {
			t.Errorf("secret kind %q is not answered by a verb", kind)
		}
	}
	if b := got["bound"].GetBucket(); b.GetBucket() != "<provider>_bound" || b.GetKeyShape() != "<node>.<module>.<provision>[.<local>]" {
		t.Errorf("bound is answered from %v", b)
	}
	if b := got["shell"].GetBucket(); b.GetBucket() != keys.CollectBucket {
		t.Errorf("shell is answered from %v, want the collect bucket", b)
	}
}

func TestValidateRejectsBadTables(t *testing.T) {
	t.Parallel()
	bucket := func(kind, name, shape string) *provisionerv1.RegistryEntry {
		return &provisionerv1.RegistryEntry{Kind: kind, Owner: "o", Description: "d",
			Source: &provisionerv1.RegistryEntry_Bucket{Bucket: &provisionerv1.BucketSource{Bucket: name, KeyShape: shape}}}
	}
	verb := func(kind, seat, subject string) *provisionerv1.RegistryEntry {
		return &provisionerv1.RegistryEntry{Kind: kind, Owner: "o", Description: "d",
			Source: &provisionerv1.RegistryEntry_Verb{Verb: &provisionerv1.VerbSource{Seat: seat, Subject: subject}}}
	}
	tests := []struct {
		name   string
		table  []*provisionerv1.RegistryEntry
		reason string
	}{
		{"no source", []*provisionerv1.RegistryEntry{{Kind: "port", Owner: "o", Description: "d"}}, "has no source"},
		{"empty bucket source", []*provisionerv1.RegistryEntry{{Kind: "port", Owner: "o", Description: "d", Source: &provisionerv1.RegistryEntry_Bucket{}}}, "empty bucket source"},
		{"duplicate kind", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>"), bucket("port", "b", "<node>")}, "answered already by entry 0"},
		{"secret in a bucket", []*provisionerv1.RegistryEntry{bucket("secret", "vault", "<node>.<name>")}, "secret kind with a bucket source"},
		{"consumers in a bucket", []*provisionerv1.RegistryEntry{bucket("consumers", "vault", "<node>")}, "secret kind with a bucket source"},
		{"unknown placeholder", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>.<nope>")}, `"<nope>" is not a placeholder`},
		{"unclosed placeholder", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>.<module")}, "is not a placeholder"},
		{"tail not at end", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>[.<local>].<module>")}, "optional tail"},
		{"tail without placeholder", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>[.x]")}, "needs a placeholder"},
		{"placeholder twice", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>.<node>")}, "stands twice"},
		{"bad literal", []*provisionerv1.RegistryEntry{bucket("port", "b", "<node>.a:b")}, `literal token "a:b"`},
		{"provider's keys not by node", []*provisionerv1.RegistryEntry{bucket("bound", "<provider>_bound", "<module>.<node>.<provision>")}, "must begin with <node>"},
		{"bad bucket", []*provisionerv1.RegistryEntry{bucket("port", "my.bucket", "<node>")}, "is not a bucket name"},
		{"wildcard subject", []*provisionerv1.RegistryEntry{verb("secret", "vault", "vault.*")}, "not a literal NATS subject"},
		{"no seat", []*provisionerv1.RegistryEntry{verb("secret", "", "vault.secret")}, "has no seat"},
		{"bad kind", []*provisionerv1.RegistryEntry{bucket("po.rt", "b", "<node>")}, "kind holds '.'"},
		{"no owner", []*provisionerv1.RegistryEntry{{Kind: "port", Description: "d", Source: &provisionerv1.RegistryEntry_Verb{Verb: &provisionerv1.VerbSource{Seat: "s", Subject: "s.x"}}}}, "has no owner"},
		{"nil entry", []*provisionerv1.RegistryEntry{nil}, "is nil"},
		{"collection shape without template", []*provisionerv1.RegistryEntry{bucket("shell", "b", "<node>.<collection>.<contributor>")}, "names no collection template"},
		{"template without collection shape", []*provisionerv1.RegistryEntry{withCollection(bucket("shell", "b", "<node>.<module>"), "<kind>:<name>")}, "needs a key shape with <collection>"},
		{"collection without contributor", []*provisionerv1.RegistryEntry{withCollection(bucket("shell", "b", "<node>.<collection>"), "<name>")}, "needs <contributor>"},
		{"template with another placeholder", []*provisionerv1.RegistryEntry{withCollection(bucket("shell", "b", "<node>.<collection>.<contributor>"), "<node>:<name>")}, "may use only <kind> and <name>"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := registry.Validate(tt.table)
			if !errors.Is(err, registry.ErrInvalidTable) || !strings.Contains(err.Error(), tt.reason) {
				t.Errorf("Validate() = %v, want ErrInvalidTable saying %q", err, tt.reason)
			}
		})
	}
}

func withCollection(e *provisionerv1.RegistryEntry, template string) *provisionerv1.RegistryEntry {
	e.GetBucket().Collection = template
	return e
}

func registryBucket(t *testing.T) jetstream.KeyValue {
	t.Helper()
	nc := natstest.Connect(t, natstest.Start(t))
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: keys.RegistryBucket})
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

func lastRevision(t *testing.T, kv jetstream.KeyValue) uint64 {
	t.Helper()
	st, err := kv.Status(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	return st.(*jetstream.KeyValueBucketStatus).StreamInfo().State.LastSeq
}

func kindsOf(table []*provisionerv1.RegistryEntry) []string {
	var kinds []string
	for _, e := range table {
		kinds = append(kinds, e.GetKind())
	}
	return kinds
}

//nolint:tparallel // the steps share one bucket and build on each other.
func TestReconcile(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	kv := registryBucket(t)
	table := registry.Table()

	first, err := registry.Reconcile(ctx, kv, table)
	if err != nil {
		t.Fatal(err)
	}
	if len(first.Written) != len(table) || len(first.Deleted)+len(first.Unchanged) != 0 {
		t.Fatalf("first run: %+v, want every kind written", first)
	}
	assertBucketHolds(t, kv, table)

	t.Run("a second run writes nothing", func(t *testing.T) {
		before := lastRevision(t, kv)
		report, err := registry.Reconcile(ctx, kv, table)
		if err != nil {
			t.Fatal(err)
		}
		if len(report.Written)+len(report.Deleted) != 0 || len(report.Unchanged) != len(table) {
			t.Errorf("second run: %+v, want all unchanged", report)
		}
		if after := lastRevision(t, kv); after != before {
			t.Errorf("bucket revision moved from %d to %d on a run that changed nothing", before, after)
		}
	})

	t.Run("a tampered entry is restored", func(t *testing.T) {
		tampered, _ := proto.Marshal(&provisionerv1.RegistryEntry{Kind: "port", Owner: "intruder"})
		if _, err := kv.Put(ctx, "port", tampered); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "dir", []byte("not a protobuf \xff\xff")); err != nil {
			t.Fatal(err)
		}
		report, err := registry.Reconcile(ctx, kv, table)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"dir", "port"}, report.Written); diff != "" {
			t.Errorf("written (-want +got):\n%s", diff)
		}
		assertBucketHolds(t, kv, table)
	})

	t.Run("a stale kind is deleted", func(t *testing.T) {
		if _, err := kv.Put(ctx, "gone", []byte{}); err != nil {
			t.Fatal(err)
		}
		if _, err := kv.Put(ctx, "bad.key", []byte{}); err != nil {
			t.Fatal(err)
		}
		smaller := table[1:]
		report, err := registry.Reconcile(ctx, kv, smaller)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff([]string{"bad.key", "config", "gone"}, report.Deleted); diff != "" {
			t.Errorf("deleted (-want +got):\n%s", diff)
		}
		assertBucketHolds(t, kv, smaller)
	})

	t.Run("an invalid table writes nothing", func(t *testing.T) {
		before := lastRevision(t, kv)
		_, err := registry.Reconcile(ctx, kv, []*provisionerv1.RegistryEntry{{Kind: "port"}})
		if !errors.Is(err, registry.ErrInvalidTable) {
			t.Fatalf("Reconcile(invalid) = %v, want ErrInvalidTable", err)
		}
		if after := lastRevision(t, kv); after != before {
			t.Errorf("revision moved from %d to %d", before, after)
		}
	})
}

func assertBucketHolds(t *testing.T, kv jetstream.KeyValue, table []*provisionerv1.RegistryEntry) {
	t.Helper()
	lister, err := kv.ListKeys(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	var stored []string
	for k := range lister.Keys() {
		stored = append(stored, k)
	}
	if diff := cmp.Diff(kindsOf(table), stored, cmpopts.SortSlices(func(a, b string) bool { return a < b })); diff != "" {
		t.Errorf("bucket keys (-want +got):\n%s", diff)
	}
	for _, want := range table {
		e, err := kv.Get(t.Context(), want.GetKind())
		if err != nil {
			t.Fatalf("get %s: %v", want.GetKind(), err)
		}
		got := &provisionerv1.RegistryEntry{}
		if err := proto.Unmarshal(e.Value(), got); err != nil {
			t.Fatalf("decode %s: %v", want.GetKind(), err)
		}
		if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
			t.Errorf("entry %s (-want +got):\n%s", want.GetKind(), diff)
		}
	}
}

// Run reconciles at once, again every interval, and returns nil once its
// context is done.
func TestReconcilerRunsEveryInterval(t *testing.T) {
	t.Parallel()
	kv := registryBucket(t)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	r := &registry.Reconciler{KV: kv, Interval: 50 * time.Millisecond}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	var e jetstream.KeyValueEntry
	natstest.CheckFor(t, 5*time.Second, func() (err error) {
		e, err = kv.Get(ctx, "port")
		return err
	})
	tampered, _ := proto.Marshal(&provisionerv1.RegistryEntry{Kind: "port", Owner: "intruder"})
	at, err := kv.Put(ctx, "port", tampered)
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 5*time.Second, func() (err error) {
		if e, err = kv.Get(ctx, "port"); err == nil && e.Revision() <= at {
			err = fmt.Errorf("a tampered entry was not restored by a later interval: %q at %d", e.Value(), e.Revision())
		}
		return err
	})
	var entry provisionerv1.RegistryEntry
	if err := proto.Unmarshal(e.Value(), &entry); err != nil || entry.GetOwner() == "intruder" {
		t.Fatalf("after the tamper: %v, %v", &entry, err)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run returned %v after its context ended, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
}

// A clean stop is no failure: Run returns nil and logs nothing of a failed
// watch, though the watcher it stops closes its updates as the context
// ends (whichever of the two the reconciler sees first). Stopped many
// times, on a bucket already reconciled and on one being written.
func TestReconcilerStopsCleanly(t *testing.T) {
	t.Parallel()
	kv := registryBucket(t)
	for i := range 20 {
		var logs testlog.Buffer
		reconciled := make(chan struct{}, 1)
		r := &registry.Reconciler{KV: kv, Interval: time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil)),
			Reconciled: func(registry.Report) {
				select {
				case reconciled <- struct{}{}:
				default:
				}
			}}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- r.Run(ctx) }()
		select {
		case <-reconciled:
		case err := <-done:
			t.Fatalf("stop %d: Run ended before its context: %v", i, err)
		case <-time.After(10 * time.Second):
			t.Fatalf("stop %d: no reconcile within 10s", i)
		}
		if i%2 == 1 { // a change in flight on the watch as it stops
			if err := kv.Delete(t.Context(), "port"); err != nil {
				t.Fatal(err)
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Errorf("stop %d: Run returned %v, want nil", i, err)
		}
		if strings.Contains(logs.String(), "failed") {
			t.Fatalf("stop %d: a clean stop was logged as a failure:\n%s", i, logs.String())
		}
	}
}

// TestReconcilerRestoresChangedEntries: whatever anyone else does to the
// registry, the running reconciler undoes it within moments, long before its
// interval; its own writes and equal values start no run.
func TestReconcilerRestoresChangedEntries(t *testing.T) {
	t.Parallel()
	other, _ := proto.Marshal(&provisionerv1.RegistryEntry{Kind: "port", Owner: "intruder"})
	tests := []struct {
		name   string
		tamper func(ctx context.Context, kv jetstream.KeyValue) error
	}{
		{"entry overwritten", func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Put(ctx, "port", other)
			return err
		}},
		{"entry deleted", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "port") }},
		{"entry purged", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Purge(ctx, "port") }},
		{"unknown kind added", func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Put(ctx, "bogus", other)
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			kv := registryBucket(t)
			table := registry.Table()
			ctx, cancel := context.WithCancel(t.Context())
			done := make(chan error, 1)
			var logs testlog.Buffer
			r := &registry.Reconciler{KV: kv, Interval: time.Hour, RestoreDelay: 20 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			go func() { done <- r.Run(ctx) }()
			defer func() {
				cancel()
				if err := <-done; err != nil {
					t.Errorf("Run: %v", err)
				}
			}()
			waitUntil(t, 5*time.Second, func() bool { return holds(t, kv, table) })
			settled := lastRevision(t, kv)
			// Nothing is written in the next 200ms: a quiet window is
			// what is checked, so it is waited out, not polled.
			time.Sleep(200 * time.Millisecond) // a quiet window, not a wait for a condition
			if after := lastRevision(t, kv); after != settled {
				t.Fatalf("the reconciler kept writing after the registry was equal: revision %d → %d", settled, after)
			}

			start := time.Now()
			if err := tt.tamper(t.Context(), kv); err != nil {
				t.Fatal(err)
			}
			waitUntil(t, 5*time.Second, func() bool { return lastRevision(t, kv) > settled+1 && holds(t, kv, table) })
			t.Logf("%s: restored after %s", tt.name, time.Since(start))
			assertBucketHolds(t, kv, table)
			// One watch did it all, restoring through its updates: none
			// failed and was made again.
			if strings.Contains(logs.String(), "failed") {
				t.Errorf("the reconciler failed on a healthy bus:\n%s", logs.String())
			}
		})
	}
}

// holds reports whether kv holds exactly table.
func holds(t *testing.T, kv jetstream.KeyValue, table []*provisionerv1.RegistryEntry) bool {
	t.Helper()
	lister, err := kv.ListKeys(t.Context())
	if err != nil {
		return false
	}
	n := 0
	for k := range lister.Keys() {
		n++
		e, err := kv.Get(t.Context(), k)
		if err != nil {
			return false
		}
		var got provisionerv1.RegistryEntry
		found := false
		for _, want := range table {
			if want.GetKind() == k && proto.Unmarshal(e.Value(), &got) == nil && proto.Equal(want, &got) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return n == len(table)
}

func waitUntil(t *testing.T, within time.Duration, ok func() bool) {
	t.Helper()
	natstest.CheckFor(t, within, func() error {
		if !ok() {
			return errors.New("the bucket does not hold the table")
		}
		return nil
	})
}

// failingPublisher refuses its first writes, as a stream does during a
// leader election, then publishes through JetStream.
type failingPublisher struct {
	js    jetstream.JetStream
	fails atomic.Int32
}

func (p *failingPublisher) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	if p.fails.Add(-1) >= 0 {
		return nil, context.DeadlineExceeded
	}
	return p.js.PublishMsg(ctx, msg, opts...)
}

// A first run that fails, as during an election, is tried again: Run never
// ends on what the bus causes.
func TestReconcilerRetriesAFailedFirstRun(t *testing.T) {
	t.Parallel()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(t.Context(), jetstream.KeyValueConfig{Bucket: keys.RegistryBucket})
	if err != nil {
		t.Fatal(err)
	}
	pub := &failingPublisher{js: js}
	pub.fails.Store(3)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	reconciled := make(chan registry.Report, 1)
	r := &registry.Reconciler{KV: kv, Publisher: pub, Reconciled: func(rep registry.Report) {
		select {
		case reconciled <- rep:
		default:
		}
	}}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	select {
	case rep := <-reconciled:
		if len(rep.Written) == 0 {
			t.Errorf("the run after the failures wrote nothing: %+v", rep)
		}
	case err := <-done:
		t.Fatalf("Run ended on a failed write: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the registry was not written within 10s of three failed writes")
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v once its context was done", err)
	}
}

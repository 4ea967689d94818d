package registry

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/backoff"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Report says what one reconciliation did, each list in key order.
type Report struct {
	// Written are the kinds written: new, changed or unreadable before.
	Written []string
	// Deleted are the keys deleted: kinds no entry answers any more.
	Deleted []string
	// Unchanged are the kinds that already held their entry.
	Unchanged []string
	// Revision is the bucket's revision once the run's last write was
	// acknowledged, or the newest revision of the entries it left alone: a
	// copy that reached it holds the whole registry.
	Revision uint64
}

// LogValue reports the counts and the keys that changed.
func (r Report) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("written", r.Written),
		slog.Any("deleted", r.Deleted),
		slog.Int("unchanged", len(r.Unchanged)),
		slog.Uint64("revision", r.Revision),
	)
}

// Reconcile makes the registry bucket hold exactly table: it writes each entry
// whose key is missing or holds anything else, deletes every key no entry
// answers, and leaves equal entries alone, so a run that changes nothing
// writes nothing. The table must be valid.
func Reconcile(ctx context.Context, kv jetstream.KeyValue, table []*provisionerv1.RegistryEntry) (Report, error) {
	return reconcile(ctx, kv, nil, table)
}

// Publisher publishes a registry write and waits for the stream's
// acknowledgement: a jetstream.JetStream, or the provisioner seat
// (seat.Seat), which makes each write conditional on the lease it holds.
type Publisher interface {
	PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// writer writes and deletes a bucket's keys: through the KV client, or as
// the KV client's own messages through a Publisher.
type writer struct {
	kv  jetstream.KeyValue
	pub Publisher
}

// put writes a key and returns the revision it was written at.
func (w writer) put(ctx context.Context, key string, value []byte) (uint64, error) {
	if w.pub == nil {
		return w.kv.Put(ctx, key, value)
	}
	ack, err := w.pub.PublishMsg(ctx, &nats.Msg{Subject: kvSubject(w.kv, key), Data: value})
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// delete writes a key's delete marker and returns its revision, where the
// KV client tells it (zero otherwise).
func (w writer) delete(ctx context.Context, key string) (uint64, error) {
	if w.pub == nil {
		return 0, w.kv.Delete(ctx, key)
	}
	msg := nats.NewMsg(kvSubject(w.kv, key))
	msg.Header.Set(kvOperation, kvDelete) // what the KV client sends for Delete
	ack, err := w.pub.PublishMsg(ctx, msg)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

// The KV client's delete marker.
const (
	kvOperation = "KV-Operation"
	kvDelete    = "DEL"
)

// kvSubject is the subject of a key of a bucket that is no mirror.
func kvSubject(kv jetstream.KeyValue, key string) string {
	return wire.KVSubject(kv.Bucket(), key)
}

func reconcile(ctx context.Context, kv jetstream.KeyValue, pub Publisher, table []*provisionerv1.RegistryEntry) (Report, error) {
	w := writer{kv: kv, pub: pub}
	if err := Validate(table); err != nil {
		return Report{}, err
	}
	stored, err := readAll(ctx, kv)
	if err != nil {
		return Report{}, fmt.Errorf("read registry bucket %s: %w", kv.Bucket(), err)
	}
	var report Report
	wanted := make(map[string]bool, len(table))
	for _, entry := range table {
		key, err := keys.RegistryKey(entry.GetKind())
		if err != nil {
			return report, err
		}
		wanted[key] = true
		if old, ok := stored[key]; ok {
			var have provisionerv1.RegistryEntry
			if proto.Unmarshal(old.Value(), &have) == nil && proto.Equal(&have, entry) {
				report.Unchanged = append(report.Unchanged, key)
				report.Revision = max(report.Revision, old.Revision())
				continue
			}
		}
		value, err := proto.MarshalOptions{Deterministic: true}.Marshal(entry)
		if err != nil {
			return report, fmt.Errorf("encode registry entry %q: %w", key, err)
		}
		revision, err := w.put(ctx, key, value)
		if err != nil {
			return report, fmt.Errorf("write registry entry %q: %w", key, err)
		}
		report.Written = append(report.Written, key)
		report.Revision = max(report.Revision, revision)
	}
	for key := range stored {
		if wanted[key] {
			continue
		}
		revision, err := w.delete(ctx, key)
		if err != nil {
			return report, fmt.Errorf("delete stale registry key %q: %w", key, err)
		}
		report.Deleted = append(report.Deleted, key)
		report.Revision = max(report.Revision, revision)
	}
	slices.Sort(report.Written)
	slices.Sort(report.Deleted)
	slices.Sort(report.Unchanged)
	return report, nil
}

// readAll returns the live entries of kv by key.
func readAll(ctx context.Context, kv jetstream.KeyValue) (map[string]jetstream.KeyValueEntry, error) {
	live, err := kvread.Live(ctx, kv)
	if err != nil {
		return nil, err
	}
	entries := make(map[string]jetstream.KeyValueEntry, len(live))
	for _, e := range live {
		entries[e.Key()] = e
	}
	return entries, nil
}

// Reconciler keeps a registry bucket equal to a table: at start, on an
// interval, and whenever the bucket changes away from the table.
type Reconciler struct {
	// KV is the registry bucket. Required.
	KV jetstream.KeyValue
	// Table is the registry to hold; nil means Table().
	Table []*provisionerv1.RegistryEntry
	// Interval between runs; zero means one hour.
	Interval time.Duration
	// RestoreDelay is how long a change by anyone else stands before it is
	// undone: a burst of changes is undone by one run, and two writers at
	// odds (a misconfigured instance) cannot make a storm of writes. Zero
	// means DefaultRestoreDelay.
	RestoreDelay time.Duration
	// Publisher sends the writes; nil means the KV client's own. Serve
	// passes the provisioner seat, so that each write is fenced by its lease.
	Publisher Publisher
	// Logger receives a line for each run; nil means slog.Default().
	Logger *slog.Logger
	// Reconciled, if set, hears each run's report once it succeeded.
	Reconciled func(Report)
}

// Defaults of Reconciler.
const (
	// DefaultInterval is how often a Reconciler runs when Interval is zero.
	DefaultInterval = time.Hour
	// DefaultRestoreDelay is how long a change stands when RestoreDelay is
	// zero: well within the 5 s in which a changed entry is restored.
	DefaultRestoreDelay = 2 * time.Second
)

// retryChange is how soon a run caused by a change is tried again after it
// failed.
const retryChange = time.Second

// Run watches the bucket, reconciles at once, then every Interval and
// RestoreDelay after any change of the bucket that leaves a key different
// from the table (a write or delete by anyone else), until ctx is done, and
// returns nil then. Only an invalid table ends it early. Whatever the bus
// causes (a watch or a write that times out in a stream's leader election,
// a lost watcher, a write refused) is logged and tried again with a backoff:
// through a seat, a lost seat ends ctx.
func (r *Reconciler) Run(ctx context.Context) error {
	table := r.table()
	if err := Validate(table); err != nil {
		return err
	}
	wanted, err := encodeTable(table)
	if err != nil {
		return err
	}
	retry := backoff.New(backoff.Config{Min: retryMin, Max: retryMax, Factor: 2, Jitter: 0.5})
	for {
		err := r.watchAndRun(ctx, wanted)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, errReconciled) {
			retry.Reset() // it had run: not a failure streak
		}
		pause := retry.Next()
		r.logger().Warn("registry reconcile failed; trying again", "err", err, "in", pause)
		if !backoff.Sleep(ctx, pause) {
			return nil
		}
	}
}

// How long Run pauses before it watches and reconciles again after a
// failure: jittered by half, doubling from retryMin to retryMax, short
// enough that the registry is written soon after an election ends.
const (
	retryMin = 250 * time.Millisecond
	retryMax = 5 * time.Second
)

// errReconciled wraps the failure of a watch whose first run had succeeded.
var errReconciled = errors.New("after a reconcile")

// watchAndRun watches the bucket, reconciles at once and then as Run says,
// until ctx is done (nil) or the watch or a first run fails.
func (r *Reconciler) watchAndRun(ctx context.Context, wanted map[string][]byte) error {
	// Watch before the first run, so that no change after it is missed. The
	// watcher lives as long as its context: that context ends when this
	// watch does, or, if making the watcher takes longer than watchTimeout
	// (an election), then, so that it is asked again.
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	giveUp := time.AfterFunc(watchTimeout, cancel)
	watcher, err := r.KV.WatchAll(wctx, jetstream.UpdatesOnly())
	if !giveUp.Stop() && err == nil {
		err = fmt.Errorf("making the watcher took longer than %s", watchTimeout)
	}
	if err != nil {
		return fmt.Errorf("watch registry bucket %s: %w", r.KV.Bucket(), err)
	}
	defer kvread.Stop(watcher)
	if _, err := r.runOnce(ctx, "start"); err != nil {
		return err
	}
	interval := r.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	delay := r.RestoreDelay
	if delay <= 0 {
		delay = DefaultRestoreDelay
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	var changed <-chan time.Time // set when a change awaits its run
	for {
		var err error
		cause := ""
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			cause = "interval"
			_, err = r.runOnce(ctx, cause)
		case e, ok := <-watcher.Updates():
			if !ok {
				return fmt.Errorf("watch registry bucket %s: %w: %w", r.KV.Bucket(), errReconciled, kvread.ErrWatcherStopped)
			}
			if e != nil && changed == nil && differs(wanted, e) {
				r.logger().Info("registry entry changed by someone else; restoring it", "key", e.Key(), "op", e.Operation().String(), "revision", e.Revision(), "in", delay)
				changed = time.After(delay)
			}
			continue
		case <-changed:
			changed = nil
			cause = "change"
			if _, err = r.runOnce(ctx, cause); err != nil {
				changed = time.After(retryChange)
			}
		}
		if err != nil && ctx.Err() == nil {
			r.logger().Error("registry reconcile failed; trying again", "cause", cause, "err", err, "interval", interval)
		}
	}
}

// watchTimeout bounds the creation of the registry's watcher: one asked
// during an election is given up and asked again.
const watchTimeout = 5 * time.Second

// encodeTable returns each entry's value as Reconcile writes it, by key.
func encodeTable(table []*provisionerv1.RegistryEntry) (map[string][]byte, error) {
	wanted := make(map[string][]byte, len(table))
	for _, entry := range table {
		key, err := keys.RegistryKey(entry.GetKind())
		if err != nil {
			return nil, err
		}
		if wanted[key], err = (proto.MarshalOptions{Deterministic: true}).Marshal(entry); err != nil {
			return nil, fmt.Errorf("encode registry entry %q: %w", key, err)
		}
	}
	return wanted, nil
}

// differs reports whether a change leaves its key other than the table holds:
// a value other than the table's (an equal value in another encoding
// included, which the run then finds equal and leaves), a key the table does
// not have, or a table key deleted.
func differs(wanted map[string][]byte, e jetstream.KeyValueEntry) bool {
	want, ok := wanted[e.Key()]
	if e.Operation() != jetstream.KeyValuePut {
		return ok
	}
	return !ok || !bytes.Equal(want, e.Value())
}

func (r *Reconciler) table() []*provisionerv1.RegistryEntry {
	if r.Table == nil {
		return Table()
	}
	return r.Table
}

func (r *Reconciler) runOnce(ctx context.Context, cause string) (Report, error) {
	report, err := reconcile(ctx, r.KV, r.Publisher, r.table())
	if err != nil {
		return report, err
	}
	level := slog.LevelDebug
	if len(report.Written)+len(report.Deleted) > 0 {
		level = slog.LevelInfo
	}
	r.logger().Log(ctx, level, "registry reconciled", "cause", cause, "report", report)
	if r.Reconciled != nil {
		r.Reconciled(report)
	}
	return report, nil
}

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}

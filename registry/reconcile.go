package registry

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/keys"
)

// Report says what one reconciliation did, each list in key order.
type Report struct {
	// Written are the kinds written: new, changed or unreadable before.
	Written []string
	// Deleted are the keys deleted: kinds no entry answers any more.
	Deleted []string
	// Unchanged are the kinds that already held their entry.
	Unchanged []string
}

// LogValue reports the counts and the keys that changed.
func (r Report) LogValue() slog.Value {
	return slog.GroupValue(
		slog.Any("written", r.Written),
		slog.Any("deleted", r.Deleted),
		slog.Int("unchanged", len(r.Unchanged)),
	)
}

// Reconcile makes the registry bucket hold exactly table: it writes each entry
// whose key is missing or holds anything else, deletes every key no entry
// answers, and leaves equal entries alone, so a run that changes nothing
// writes nothing. The table must be valid.
func Reconcile(ctx context.Context, kv jetstream.KeyValue, table []*provisionerv1.RegistryEntry) (Report, error) {
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
				continue
			}
		}
		value, err := proto.MarshalOptions{Deterministic: true}.Marshal(entry)
		if err != nil {
			return report, fmt.Errorf("encode registry entry %q: %w", key, err)
		}
		if _, err := kv.Put(ctx, key, value); err != nil {
			return report, fmt.Errorf("write registry entry %q: %w", key, err)
		}
		report.Written = append(report.Written, key)
	}
	for key := range stored {
		if wanted[key] {
			continue
		}
		if err := kv.Delete(ctx, key); err != nil {
			return report, fmt.Errorf("delete stale registry key %q: %w", key, err)
		}
		report.Deleted = append(report.Deleted, key)
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

// Reconciler keeps a registry bucket equal to a table: at start and then on
// an interval.
type Reconciler struct {
	// KV is the registry bucket. Required.
	KV jetstream.KeyValue
	// Table is the registry to hold; nil means Table().
	Table []*provisionerv1.RegistryEntry
	// Interval between runs; zero means one hour.
	Interval time.Duration
	// Logger receives a line for each run; nil means slog.Default().
	Logger *slog.Logger
}

// DefaultInterval is how often a Reconciler runs when Interval is zero.
const DefaultInterval = time.Hour

// Run reconciles at once, then every Interval until ctx is done, and returns
// then. The first run's error ends Run: a registry that cannot be written at
// start is a configuration to fix. A later run that fails is logged and
// tried again at the next tick.
func (r *Reconciler) Run(ctx context.Context) error {
	if _, err := r.runOnce(ctx); err != nil {
		return err
	}
	interval := r.Interval
	if interval <= 0 {
		interval = DefaultInterval
	}
	ticker := time.NewTicker(interval)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-ticker.C:
			if _, err := r.runOnce(ctx); err != nil && ctx.Err() == nil {
				r.logger().Error("registry reconcile failed; trying again at the next interval", "err", err, "interval", interval)
			}
		}
	}
}

func (r *Reconciler) runOnce(ctx context.Context) (Report, error) {
	table := r.Table
	if table == nil {
		table = Table()
	}
	report, err := Reconcile(ctx, r.KV, table)
	if err != nil {
		return report, err
	}
	level := slog.LevelDebug
	if len(report.Written)+len(report.Deleted) > 0 {
		level = slog.LevelInfo
	}
	r.logger().Log(ctx, level, "registry reconciled", "report", report)
	return report, nil
}

func (r *Reconciler) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.Default()
	}
	return r.Logger
}

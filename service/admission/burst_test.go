package admission

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/google/go-cmp/cmp"
)

// lockedLog is a JSON log that the burst's timer may write beside the test.
type lockedLog struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *lockedLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// records returns the log's records, without their time and level.
func (l *lockedLog) records(t *testing.T) []map[string]any {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for line := range strings.Lines(l.buf.String()) {
		var r map[string]any
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			t.Fatalf("log line %q: %v", line, err)
		}
		delete(r, "time")
		delete(r, "level")
		out = append(out, r)
	}
	return out
}

// A burst of events is logged twice: when it starts, and once it has been
// quiet for BurstLog.quiet, with its count by subject and how long it
// lasted. Stop logs a burst in progress and ends the logging. The clock is
// synctest's: the test waits for no timer (elapse).
func TestBurstLogLogsABurstTwice(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		log := &lockedLog{}
		b := NewBurstLog(slog.New(slog.NewJSONHandler(log, nil)), "dropped", 5*time.Second)
		want := []map[string]any{}
		expect := func(when string) {
			t.Helper()
			synctest.Wait()
			if diff := cmp.Diff(want, log.records(t)); diff != "" {
				t.Errorf("%s (-want +got):\n%s", when, diff)
			}
		}
		started := func(subject string) map[string]any {
			return map[string]any{"msg": "dropped", "subject": subject, "burst": "started"}
		}
		ended := func(reports int, bySubject map[string]any, lasted time.Duration) map[string]any {
			return map[string]any{"msg": "dropped", "burst": "ended", "reports": float64(reports), "by_subject": bySubject, "lasted": float64(lasted)}
		}

		b.Event("a")
		want = append(want, started("a"))
		expect("the first event")
		elapse(4 * time.Second)
		b.Event("a")
		b.Event("b")
		expect("events within the quiet time")
		elapse(5*time.Second - time.Nanosecond)
		expect("just before the quiet time after the last event")
		elapse(time.Nanosecond)
		want = append(want, ended(3, map[string]any{"a": float64(2), "b": float64(1)}, 9*time.Second))
		expect("the quiet time after the last event")

		// The next event starts a new burst; Stop ends it at once.
		elapse(time.Minute)
		b.Event("c")
		want = append(want, started("c"))
		elapse(time.Second)
		b.Stop()
		want = append(want, ended(1, map[string]any{"c": float64(1)}, time.Second))
		expect("stopped in a burst")
		b.Event("c")
		elapse(time.Minute)
		expect("events after the stop")
	})
}

// Stop between bursts logs nothing.
func TestBurstLogStoppedBetweenBursts(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		log := &lockedLog{}
		b := NewBurstLog(slog.New(slog.NewJSONHandler(log, nil)), "dropped", 5*time.Second)
		b.Event("a")
		elapse(time.Minute)
		b.Stop()
		synctest.Wait()
		if n := len(log.records(t)); n != 2 {
			t.Errorf("%d records, want the burst's 2 and none for the stop", n)
		}
	})
}

// elapse advances the synctest bubble's fake clock by d, firing the timers
// due meanwhile: no wall time passes and nothing is waited for. Inside a
// bubble, a sleep is how its clock moves (testing/synctest has no other).
func elapse(d time.Duration) {
	time.Sleep(d) // synctest's fake clock: advances it, takes no wall time
}

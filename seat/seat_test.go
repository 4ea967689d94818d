package seat

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// instance is one campaigner on its own connection.
type instance struct {
	nc   *nats.Conn
	seat *Seat
	stop context.CancelFunc
	done chan struct{} // closed when Run returned
	err  error         // what Run returned
}

// quiet is a logger for the seats; -v shows nothing of them unless asked.
func quiet() *slog.Logger { return slog.New(slog.NewTextHandler(io.Discard, nil)) }

// campaign starts a seat on a new connection to url that runs until the test
// ends or stop is called; its tenure waits for its context.
func campaign(t *testing.T, url string, cfg Config, opts ...nats.Option) *instance {
	t.Helper()
	nc, err := nats.Connect(url, append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	cfg.JS, _ = jetstream.New(nc)
	if cfg.Logger == nil {
		cfg.Logger = quiet()
	}
	s, err := New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	in := &instance{nc: nc, seat: s, stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(in.done)
		in.err = s.Run(ctx, func(ctx context.Context) error { <-ctx.Done(); return nil })
	}()
	t.Cleanup(func() { cancel(); <-in.done })
	return in
}

// holders returns the instances that hold the seat now.
func holders(ins []*instance) []*instance {
	var out []*instance
	for _, in := range ins {
		if held, _ := in.seat.Held(); held {
			out = append(out, in)
		}
	}
	return out
}

// waitForOneHolder waits until exactly one of ins holds the seat, and
// returns it and how long that took.
func waitForOneHolder(t *testing.T, ins []*instance, within time.Duration) (*instance, time.Duration) {
	t.Helper()
	start := time.Now()
	var one *instance
	natstest.CheckFor(t, within, func() error {
		h := holders(ins)
		if len(h) != 1 {
			return fmt.Errorf("no single holder among %d instances (holders: %d)", len(ins), len(h))
		}
		one = h[0]
		return nil
	})
	return one, time.Since(start)
}

func startWithBuckets(t *testing.T) (*server.Server, jetstream.JetStream) {
	t.Helper()
	s := natstest.Start(t)
	js, _ := jetstream.New(natstest.Connect(t, s))
	if err := buckets.Ensure(t.Context(), js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	return s, js
}

func without(ins []*instance, gone *instance) []*instance {
	return slices.DeleteFunc(slices.Clone(ins), func(x *instance) bool { return x == gone })
}

func TestExactlyOneHoldsAndAStandbyTakesOver(t *testing.T) {
	t.Parallel()
	for _, n := range []int{2, 3} {
		t.Run(fmt.Sprintf("%d instances", n), func(t *testing.T) {
			t.Parallel()
			s, _ := startWithBuckets(t)
			logs := &logBuffer{}
			cfg := Config{TTL: 2 * time.Second, Poll: 50 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))}
			var ins []*instance
			for range n {
				ins = append(ins, campaign(t, s.ClientURL(), cfg))
			}
			holder, _ := waitForOneHolder(t, ins, 5*time.Second)
			// For several renewals, never two holders, never none: sampled
			// every 5ms for two TTLs, a period, not a condition waited for.
			sample, watch := time.NewTicker(5*time.Millisecond), time.After(2*cfg.TTL)
			for watching := true; watching; {
				if h := holders(ins); len(h) != 1 || h[0] != holder {
					t.Fatalf("holders changed to %d while the holder lived", len(h))
				}
				select {
				case <-watch:
					watching = false
				case <-sample.C:
				}
			}
			sample.Stop()
			// Standbys know who holds it.
			for _, in := range without(ins, holder) {
				if st := in.seat.Status(); st.Held || st.Holder != holder.seat.ID() {
					t.Errorf("standby status %+v, want holder %s", st, holder.seat.ID())
				}
			}

			// The holder dies without a word: its connection is gone. A
			// standby takes the seat once the lease runs out, about TTL + Poll
			// later; the figure is logged, not asserted, as timings stretch
			// under -race on a busy machine: the wait's 10s (five TTLs) is
			// the only bound.
			holder.nc.Close()
			rest := without(ins, holder)
			next, took := waitForOneHolder(t, rest, 10*time.Second)
			t.Logf("abrupt death: %s took the seat after %s (TTL %s)", next.seat.ID(), took, cfg.TTL)

			// A clean stop hands the seat over at once: the holder hands it
			// back (which its log says) rather than let its lease run out.
			if len(rest) > 1 {
				next.stop()
				<-next.done
				if !logs.has("handed the provisioner seat back", "seat_id="+next.seat.ID()) {
					t.Errorf("the stopped holder did not hand the seat back; log:\n%s", logs)
				}
				after, took := waitForOneHolder(t, without(rest, next), 5*time.Second)
				t.Logf("clean stop: %s took the seat after %s", after.seat.ID(), took)
			}
		})
	}
}

// TestAStalledHolderCannotWrite proves the fence: a holder that stopped
// renewing (paused, partitioned) and writes after it lost the seat is refused
// by the stream, whether its lease expired or another instance took it.
func TestAStalledHolderCannotWrite(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		takeOver bool
	}{
		{"lease expired, seat vacant", false},
		{"seat taken over", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			s, js := startWithBuckets(t)
			ctx := t.Context()
			registry, _ := js.KeyValue(ctx, keys.RegistryBucket)
			stalled, err := New(ctx, Config{JS: js, TTL: time.Second, Logger: quiet()})
			if err != nil {
				t.Fatal(err)
			}
			// It takes the seat and writes, then stalls: no Run, no renewals.
			if !stalled.tryAcquire(ctx) {
				t.Fatal("the vacant seat was not taken")
			}
			if _, err := stalled.PublishMsg(ctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port"), Data: []byte("holder's")}); err != nil {
				t.Fatalf("the holder's write: %v", err)
			}
			if tt.takeOver {
				other := campaign(t, s.ClientURL(), Config{TTL: time.Second, Poll: 50 * time.Millisecond})
				waitForOneHolder(t, []*instance{other}, 5*time.Second)
			} else {
				// The stream removes the lease once its TTL has run out.
				natstest.CheckFor(t, 5*time.Second, func() error {
					if l, _, err := stalled.read(ctx); err != nil || l.Holder != "" {
						return fmt.Errorf("the lease did not expire: %+v, %w", l, err)
					}
					return nil
				})
			}
			// It wakes up still believing it holds the seat, and writes.
			if held, _ := stalled.Held(); !held {
				t.Fatal("the stalled holder noticed; the test proves nothing")
			}
			_, err = stalled.PublishMsg(ctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port"), Data: []byte("stale")})
			if !errors.Is(err, ErrFenced) || !errors.Is(err, ErrNotHeld) {
				t.Fatalf("stalled write: %v, want ErrFenced", err)
			}
			if e, err := registry.Get(ctx, "port"); err != nil || string(e.Value()) != "holder's" {
				t.Errorf("registry key after the stalled write: %v %v, want the holder's write", e, err)
			}
			if held, _ := stalled.Held(); held {
				t.Error("the refused holder still believes it holds the seat")
			}
			if _, err := stalled.PublishMsg(ctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port")}); !errors.Is(err, ErrNotHeld) {
				t.Errorf("a write after the seat is known lost: %v, want ErrNotHeld", err)
			}
		})
	}
}

// TestRenewalsKeepFencedWritesValid: writes and renewals interleave for
// several TTLs; no write is refused while the seat is held. A refused write
// ends the tenure's context before PublishMsg returns (loseLocked), so a
// write's error is judged by what it is, not by whether the context ended:
// ErrFenced or ErrNotHeld always fails the test, any other error only
// while the tenure runs (a write cut short by the end of the test).
func TestRenewalsKeepFencedWritesValid(t *testing.T) {
	t.Parallel()
	_, js := startWithBuckets(t)
	s, err := New(t.Context(), Config{JS: js, TTL: time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 3*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var writes int
	var writeErr error
	err = s.Run(ctx, func(ctx context.Context) error {
		wg.Go(func() {
			for ctx.Err() == nil {
				_, err := s.PublishMsg(ctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port"), Data: []byte("x")})
				if errors.Is(err, ErrNotHeld) || (err != nil && ctx.Err() == nil) {
					writeErr = err
					return
				}
				writes++
			}
		})
		<-ctx.Done()
		wg.Wait()
		return nil
	})
	if err != nil || writeErr != nil {
		t.Fatalf("run %v, write %v", err, writeErr)
	}
	if writes < 10 {
		t.Errorf("%d writes in 3s", writes)
	}
	// Handed back on the way out.
	l, seq, err := s.read(t.Context())
	if err != nil || l.Holder != "" || seq == 0 {
		t.Errorf("after Run: lease %+v at %d (%v), want the seat handed back", l, seq, err)
	}
}

// A renewal refused because an earlier attempt went through unanswered
// adopts its own lease's sequence and renews again at once; one refused
// because the lease is another's loses the seat.
func TestARenewalAdoptsItsOwnLeaseOnly(t *testing.T) {
	t.Parallel()
	_, js := startWithBuckets(t)
	s, err := New(t.Context(), Config{JS: js, TTL: 5 * time.Second, Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	if !s.tryAcquire(t.Context()) {
		t.Fatal("the vacant seat was not taken")
	}
	// The attempt that went through but whose answer was lost.
	s.mu.Lock()
	ack, err := s.publishLease(t.Context(), lease{Holder: s.cfg.ID, Since: s.since.UTC()}, s.rev)
	renewedBefore := s.renewed
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	held, next := s.renew(t.Context())
	s.mu.Lock()
	rev, renewed := s.rev, s.renewed
	s.mu.Unlock()
	if !held || next != 0 || rev != ack.Sequence || !renewed.Equal(renewedBefore) {
		t.Fatalf("after a refused renewal of its own lease: held %v, next %s, rev %d (want %d), renewed moved %v: want adopted, not counted as renewed, renewed again at once",
			held, next, rev, ack.Sequence, !renewed.Equal(renewedBefore))
	}
	if held, next = s.renew(t.Context()); !held || next != s.cfg.TTL/renewsPerTTL {
		t.Fatalf("the renewal after the adoption: held %v, next %s", held, next)
	}

	// Another's lease at the seat: the next renewal loses it.
	s.mu.Lock()
	_, err = s.publishLease(t.Context(), lease{Holder: "another", Since: time.Now().UTC()}, s.rev)
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if held, _ = s.renew(t.Context()); held || s.Status().Held {
		t.Fatal("a renewal over another's lease kept the seat")
	}
}

// A renewal that went through but whose answer was lost (cut short by the
// stop, say) does not keep the seat from being handed back: the hand-back
// adopts its own lease, and hands back no other's.
func TestTheHandBackAdoptsItsOwnLeaseOnly(t *testing.T) {
	t.Parallel()
	_, js := startWithBuckets(t)
	take := func() *Seat {
		t.Helper()
		s, err := New(t.Context(), Config{JS: js, TTL: 5 * time.Second, Logger: quiet()})
		if err != nil {
			t.Fatal(err)
		}
		if !s.tryAcquire(t.Context()) {
			t.Fatal("the vacant seat was not taken")
		}
		return s
	}
	s := take()
	s.mu.Lock()
	_, err := s.publishLease(t.Context(), lease{Holder: s.cfg.ID, Since: s.since.UTC()}, s.rev)
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s.release(t.Context())
	if l, _, err := s.read(t.Context()); err != nil || l.Holder != "" {
		t.Fatalf("after the hand-back: lease %+v (%v), want the seat vacant", l, err)
	}

	// Another's lease at the seat: the hand-back leaves it there.
	s = take()
	s.mu.Lock()
	_, err = s.publishLease(t.Context(), lease{Holder: "another", Since: time.Now().UTC()}, s.rev)
	s.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	s.release(t.Context())
	if l, _, err := s.read(t.Context()); err != nil || l.Holder != "another" {
		t.Fatalf("after a hand-back over another's lease: lease %+v (%v), want another's kept", l, err)
	}
}

// has reports whether a line of the log holds every one of parts.
// logBuffer is a log the seats' goroutines write at once.
type logBuffer struct{ testlog.Buffer }

func (b *logBuffer) has(parts ...string) bool {
	for line := range strings.Lines(b.String()) {
		if !slices.ContainsFunc(parts, func(p string) bool { return !strings.Contains(line, p) }) {
			return true
		}
	}
	return false
}

// TestAStandbyThatCannotTakeTheSeatWarnsOnce: an election, or a grant that
// lacks the seat's subject, fails every attempt to take the vacant seat;
// the first failure is a warning and the others are at debug level, until
// the seat is taken or seen held.
func TestAStandbyThatCannotTakeTheSeatWarnsOnce(t *testing.T) {
	t.Parallel()
	s := natstest.StartDenying(t, "standby", wire.SeatSubject)
	js, _ := jetstream.New(natstest.Connect(t, s, nats.UserInfo("admin", "admin")))
	if err := buckets.Ensure(t.Context(), js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	logs := &logBuffer{}
	standby := campaign(t, s.ClientURL(), Config{TTL: time.Second, Poll: 50 * time.Millisecond,
		Logger: slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))},
		nats.UserInfo("standby", "standby"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	natstest.CheckFor(t, 10*time.Second, func() error {
		if n := strings.Count(logs.String(), "level=DEBUG msg=\"taking the vacant provisioner seat failed\""); n < 3 {
			return fmt.Errorf("%d failed attempts logged at debug level, want 3", n)
		}
		return nil
	})
	if standby.seat.Status().Held {
		t.Fatal("a standby denied the seat's subject holds the seat")
	}
	if n := strings.Count(logs.String(), "level=WARN msg=\"taking the vacant provisioner seat failed"); n != 1 {
		t.Fatalf("%d warnings of a failed take, want 1:\n%s", n, logs.String())
	}
}

package seat

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// Errors of the seat.
var (
	// ErrNotHeld is returned by PublishMsg when this instance does not hold
	// the seat, and wrapped by ErrFenced.
	ErrNotHeld = errors.New("the provisioner seat is not held")
	// ErrFenced is returned by PublishMsg when the stream refused the write
	// because the lease it was conditional on is no longer the seat's: the
	// seat expired or was taken over. It wraps ErrNotHeld.
	ErrFenced = fmt.Errorf("write refused by the seat's fence: %w", ErrNotHeld)
)

// Config says which seat to hold and how.
type Config struct {
	// JS is the JetStream context the lease is kept and the fenced writes
	// published through. Required.
	JS jetstream.JetStream
	// Stream holds the lease; empty means the registry bucket's stream, so
	// that registry writes can be fenced by it.
	Stream string
	// Subject of the lease in Stream; empty means wire.SeatSubject.
	Subject string
	// ID names this instance in the lease; empty means a fresh unique id.
	ID string
	// TTL is the lease's life without renewal: a holder that dies loses the
	// seat this long after its last renewal. Zero means DefaultTTL; at least
	// one second (the stream's TTL granularity).
	TTL time.Duration
	// Poll is how often a standby reads the seat; zero means DefaultPoll.
	Poll time.Duration
	// Logger receives the seat's changes; nil means slog.Default().
	Logger *slog.Logger
	// Name is the seat as the log names it; empty means "provisioner seat".
	Name string
}

// Defaults of Config. A dead holder's lease runs out TTL after its last
// renewal, and a standby sees it gone within Poll: a dead holder is replaced
// within TTL + Poll and about a second of the stream's expiry timer.
const (
	DefaultTTL  = 6 * time.Second
	DefaultPoll = 250 * time.Millisecond
)

// How a holder keeps its lease. It renews it renewsPerTTL times a TTL. A
// renewal that fails (the stream is electing a leader, and has no responder
// or does not answer) is tried again every renewRetry, each attempt bounded
// by attempt, until the lease runs out by the holder's own clock: TTL after
// the last renewal that succeeded was sent, which is before the stream
// stored it. So the holder keeps its seat through any election that ends
// before its lease does (a renewal lands within attempt + renewRetry of the
// election's end), and stops acting no later than the stream can have
// removed its lease.
const (
	renewsPerTTL = 12
	renewRetry   = 100 * time.Millisecond
	minAttempt   = 250 * time.Millisecond
)

// Status is what an instance knows of the seat.
type Status struct {
	// Held is true while this instance holds the seat.
	Held bool
	// Since is when this instance took the seat (Held) or last became a
	// standby.
	Since time.Time
	// Holder is the id of the holder as last seen, this instance's own when
	// Held; empty when the seat was last seen vacant.
	Holder string
	// HolderSince is when Holder took the seat, as its lease says.
	HolderSince time.Time
}

// lease is the value of the seat's message; an empty message is a vacant seat.
type lease struct {
	Holder string    `json:"holder"`
	Since  time.Time `json:"since"`
}

// Seat is one instance's part in holding the seat. Run campaigns for it;
// PublishMsg is a registry write fenced by it.
type Seat struct {
	cfg    Config
	stream jetstream.Stream
	logger *slog.Logger

	// mu orders fenced writes against renewals: a write carries the sequence
	// of the lease as it stands, never one being replaced.
	mu      sync.Mutex
	held    bool
	rev     uint64    // the lease's sequence in the stream, while held
	since   time.Time // when this tenure began
	renewed time.Time // when the last renewal that succeeded was sent
	// failing counts the renewals that failed since the last that
	// succeeded.
	failing int
	// takeFailing counts the attempts to take the vacant seat that failed
	// in a row: an election fails one every quarter second, and only the
	// first is a warning.
	takeFailing int
	// endTenure ends the running tenure's context; set while held.
	endTenure context.CancelFunc

	status atomic.Pointer[Status]
}

// New binds the seat's stream, which must exist (buckets.Ensure creates it
// with message TTLs allowed and the seat's subject).
func New(ctx context.Context, cfg Config) (*Seat, error) {
	if cfg.JS == nil {
		return nil, errors.New("seat: Config.JS is required")
	}
	if cfg.Stream == "" {
		cfg.Stream = wire.StreamOf(keys.RegistryBucket)
	}
	if cfg.Subject == "" {
		cfg.Subject = wire.SeatSubject
	}
	if cfg.ID == "" {
		cfg.ID = rand.Text()
	}
	if cfg.TTL == 0 {
		cfg.TTL = DefaultTTL
	}
	if cfg.TTL < time.Second {
		return nil, fmt.Errorf("seat: TTL %s: use at least 1s", cfg.TTL)
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Name == "" {
		cfg.Name = "provisioner seat"
	}
	stream, err := cfg.JS.Stream(ctx, cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("seat: stream %s: %w", cfg.Stream, err)
	}
	s := &Seat{cfg: cfg, stream: stream, logger: cfg.Logger.With("seat_id", cfg.ID)}
	s.status.Store(&Status{Since: time.Now()})
	return s, nil
}

// ID is this instance's id in the lease.
func (s *Seat) ID() string { return s.cfg.ID }

// Status returns what this instance knows of the seat now. It never waits.
func (s *Seat) Status() Status { return *s.status.Load() }

// Held reports whether this instance holds the seat, and since when it holds
// it or has been a standby.
func (s *Seat) Held() (bool, time.Time) {
	st := s.Status()
	return st.Held, st.Since
}

// Run campaigns for the seat until ctx is done. Each time it takes the seat
// it calls tenure with a context that ends when the seat is lost or ctx is
// done, and renews the lease until then. When ctx is done it waits for
// tenure to return and hands the seat back, so that a standby takes it at
// once, then returns nil.
//
// A tenure that returns an error wrapping ErrNotHeld, or after its context
// ended, has lost the seat: Run stands by again. Any other error from tenure
// is handed back with the seat and ends Run.
func (s *Seat) Run(ctx context.Context, tenure func(ctx context.Context) error) error {
	poll := time.NewTicker(s.cfg.Poll)
	defer poll.Stop()
	for {
		if s.tryAcquire(ctx) {
			if err := s.hold(ctx, tenure); err != nil || ctx.Err() != nil {
				return err
			}
			continue // lost: stand by again at once
		}
		select {
		case <-ctx.Done():
			return nil
		case <-poll.C:
		}
	}
}

// hold runs one tenure: tenure beside the renewals, until the seat is lost
// (nil) or ctx is done (nil, the seat handed back), or tenure fails (its
// error, the seat handed back).
func (s *Seat) hold(ctx context.Context, tenure func(ctx context.Context) error) error {
	tctx, cancel := context.WithCancel(ctx)
	defer cancel()
	s.mu.Lock()
	s.endTenure = cancel
	s.mu.Unlock()
	done := make(chan error, 1)
	go func() { done <- tenure(tctx) }()
	renew := time.NewTimer(s.cfg.TTL / renewsPerTTL)
	defer renew.Stop()
	for {
		select {
		case err := <-done:
			switch {
			case ctx.Err() != nil:
				s.release(ctx)
				return nil
			case tctx.Err() != nil || errors.Is(err, ErrNotHeld):
				s.stepDown("the tenure ended on a lost seat", err)
				return nil
			case err != nil:
				s.release(ctx)
				return err
			}
			done = nil // tenure is done with its work; keep the seat
		case <-renew.C:
			held, next := s.renew(ctx)
			renew.Reset(next)
			if !held {
				cancel()
				if done != nil {
					if err := <-done; err != nil {
						s.logger.Debug("the tenure ended with the seat lost", "err", err)
					}
				}
				return nil
			}
		case <-ctx.Done():
			cancel()
			if done != nil {
				if err := <-done; err != nil {
					s.logger.Debug("the tenure ended with the stop", "err", err)
				}
			}
			s.release(ctx)
			return nil
		}
	}
}

// read returns the seat's last message: its lease (zero when vacant) and its
// sequence (zero when there is none).
func (s *Seat) read(ctx context.Context) (lease, uint64, error) {
	msg, err := s.stream.GetLastMsgForSubject(ctx, s.cfg.Subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return lease{}, 0, nil
	}
	if err != nil {
		return lease{}, 0, err
	}
	l, ok := liveLease(msg)
	if !ok {
		// Not a live lease (empty, undecodable, another shape, or written
		// without a TTL, so never to expire): a vacant seat, which a
		// standby takes by a compare-and-set on this message's sequence.
		l = lease{}
	}
	return l, msg.Sequence, nil
}

// liveLease decodes a lease as this package writes it: a JSON object naming
// its holder and carrying a TTL, so that it expires with its holder.
func liveLease(msg *jetstream.RawStreamMsg) (lease, bool) {
	if len(msg.Data) == 0 || msg.Header.Get(jetstream.MsgTTLHeader) == "" {
		return lease{}, false
	}
	var l lease
	dec := json.NewDecoder(bytes.NewReader(msg.Data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&l); err != nil || l.Holder == "" || l.Since.IsZero() || dec.More() {
		return lease{}, false
	}
	return l, true
}

// attempt bounds one read or publish of the seat's: TTL/renewsPerTTL, at
// least minAttempt and at most TTL/3.
func (s *Seat) attempt() time.Duration {
	return min(max(s.cfg.TTL/renewsPerTTL, minAttempt), s.cfg.TTL/3)
}

// tryAcquire takes the seat if it is vacant, and reports whether it did.
func (s *Seat) tryAcquire(ctx context.Context) bool {
	rctx, cancel := context.WithTimeout(ctx, s.attempt())
	defer cancel()
	current, seq, err := s.read(rctx)
	if err != nil {
		if ctx.Err() == nil {
			s.logger.Debug("reading the "+s.cfg.Name+" failed", "err", err)
		}
		return false
	}
	previous := s.Status()
	if current.Holder != "" {
		s.mu.Lock()
		s.takeFailing = 0
		s.mu.Unlock()
		if current.Holder != previous.Holder || !current.Since.Equal(previous.HolderSince) {
			s.logger.Info("the "+s.cfg.Name+" is held", "holder", current.Holder, "holder_since", current.Since)
			s.status.Store(&Status{Since: previous.Since, Holder: current.Holder, HolderSince: current.Since})
		}
		return false
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := time.Now()
	mine := lease{Holder: s.cfg.ID, Since: now.UTC()}
	ack, err := s.publishLease(rctx, mine, seq)
	if err != nil {
		if !isWrongLastSequence(err) && ctx.Err() == nil {
			if s.takeFailing == 0 {
				s.logger.Warn("taking the vacant "+s.cfg.Name+" failed; trying again (each further failure at debug level)", "err", err)
			} else {
				s.logger.Debug("taking the vacant "+s.cfg.Name+" failed", "err", err, "failed", s.takeFailing+1)
			}
			s.takeFailing++
		}
		return false
	}
	s.held, s.rev, s.since, s.renewed, s.failing = true, ack.Sequence, now, now, 0
	s.status.Store(&Status{Held: true, Since: now, Holder: s.cfg.ID, HolderSince: mine.Since})
	s.logger.Info("took the "+s.cfg.Name, "previous_holder", previous.Holder, "lease_sequence", ack.Sequence, "failed_before", s.takeFailing)
	s.takeFailing = 0
	return true
}

// publishLease publishes l on the seat's subject, expecting the subject's
// last sequence to be seq (zero: no message). It is tried once: a stream
// without a leader has no responder, and the caller tries again on its own
// schedule rather than nats.go's.
func (s *Seat) publishLease(ctx context.Context, l lease, seq uint64) (*jetstream.PubAck, error) {
	data, err := json.Marshal(l)
	if err != nil {
		return nil, err
	}
	return s.cfg.JS.PublishMsg(ctx, &nats.Msg{Subject: s.cfg.Subject, Data: data},
		jetstream.WithExpectLastSequencePerSubject(seq), jetstream.WithMsgTTL(s.cfg.TTL), jetstream.WithRetryAttempts(0))
}

// renew renews the lease, and reports whether the seat is still held and
// when to renew next: at the next period after a renewal, after renewRetry
// after a failed one, and never later than the lease's end by this holder's
// clock, when the seat is lost unless a renewal went through.
func (s *Seat) renew(ctx context.Context) (held bool, next time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held {
		return false, 0
	}
	left := s.cfg.TTL - time.Since(s.renewed)
	if left <= 0 {
		s.loseLocked("the lease could not be renewed within its TTL", context.DeadlineExceeded)
		return false, 0
	}
	// An attempt never outlives the lease: past it, the seat is lost.
	rctx, cancel := context.WithTimeout(ctx, min(s.attempt(), left))
	defer cancel()
	sent := time.Now()
	ack, err := s.publishLease(rctx, lease{Holder: s.cfg.ID, Since: s.since.UTC()}, s.rev)
	if err == nil {
		if s.failing > 0 {
			s.logger.Info("renewed the "+s.cfg.Name+" after failed renewals", "failed", s.failing,
				"lease_left", left.Round(time.Millisecond))
		}
		s.rev, s.renewed, s.failing = ack.Sequence, sent, 0
		return true, s.cfg.TTL / renewsPerTTL
	}
	if isWrongLastSequence(err) {
		adopted, readErr := s.tryAdoptLocked(ctx)
		switch {
		case adopted:
			// An attempt whose answer was lost had gone through: its
			// sequence is adopted, but when it was stored is not known,
			// so the lease is renewed again at once on that sequence.
			return true, 0
		case readErr == nil:
			s.loseLocked("the lease was taken over or expired", err)
			return false, 0
		}
		// Refused, but whose the seat is could not be read: a failed
		// renewal, tried again while the lease lasts.
		err = fmt.Errorf("%w; then reading the seat: %w", err, readErr)
	}
	if time.Since(s.renewed) >= s.cfg.TTL {
		s.loseLocked("the lease could not be renewed within its TTL", err)
		return false, 0
	}
	if s.failing == 0 && ctx.Err() == nil {
		s.logger.Warn("renewing the "+s.cfg.Name+" failed; trying again until the lease runs out", "err", err, "every", renewRetry,
			"lease_left", left.Round(time.Millisecond))
	}
	s.failing++
	return true, min(renewRetry, max(s.cfg.TTL-time.Since(s.renewed), 0))
}

// adoptLocked reads the seat after a refused compare-and-set: if the lease
// there is this tenure's own (an earlier publish went through but its answer
// was lost), it adopts its sequence and reports true.
func (s *Seat) adoptLocked(ctx context.Context) bool {
	adopted, _ := s.tryAdoptLocked(ctx)
	return adopted
}

// tryAdoptLocked is adoptLocked that tells a seat read as another's (false,
// nil) from a seat it could not read (false, the error).
func (s *Seat) tryAdoptLocked(ctx context.Context) (bool, error) {
	rctx, cancel := context.WithTimeout(ctx, s.attempt())
	defer cancel()
	current, seq, err := s.read(rctx)
	if err != nil {
		return false, err
	}
	if current.Holder != s.cfg.ID || !current.Since.Equal(s.since.UTC()) {
		return false, nil
	}
	s.rev = seq
	return true, nil
}

// PublishMsg publishes a registry write conditional on the lease held: the
// stream stores it only if the seat's subject still ends with this holder's
// lease. It returns ErrNotHeld when the seat is not held, and ErrFenced when
// the stream refused the write; the seat is then lost.
//
// It has the shape of jetstream.JetStream.PublishMsg, so a registry writer
// takes either.
func (s *Seat) PublishMsg(ctx context.Context, msg *nats.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held {
		return nil, ErrNotHeld
	}
	opts = append(opts, jetstream.WithExpectLastSequenceForSubject(s.rev, s.cfg.Subject))
	ack, err := s.cfg.JS.PublishMsg(ctx, msg, opts...)
	if isWrongLastSequence(err) {
		if s.adoptLocked(ctx) {
			opts[len(opts)-1] = jetstream.WithExpectLastSequenceForSubject(s.rev, s.cfg.Subject)
			if ack, err = s.cfg.JS.PublishMsg(ctx, msg, opts...); !isWrongLastSequence(err) {
				return ack, err
			}
		}
		s.loseLocked("a registry write was refused by the seat's fence", err)
		return nil, fmt.Errorf("%w: %s: %w", ErrFenced, msg.Subject, err)
	}
	return ack, err
}

// loseLocked records that the seat is no longer held.
func (s *Seat) loseLocked(why string, err error) {
	if !s.held {
		return
	}
	s.held = false
	if s.endTenure != nil {
		s.endTenure() // the tenure ends at once, not at the next renewal
	}
	now := time.Now()
	s.status.Store(&Status{Since: now})
	s.logger.Warn("lost the "+s.cfg.Name, "why", why, "err", err, "held_for", now.Sub(s.since).Round(time.Millisecond))
}

// stepDown records a lost seat found by the tenure.
func (s *Seat) stepDown(why string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.loseLocked(why, err)
}

// release hands the seat back: an empty message, published only if the
// seat's subject still ends with this holder's lease, so a standby takes the
// seat at its next read instead of waiting for the TTL.
func (s *Seat) release(ctx context.Context) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.held {
		return
	}
	s.held = false
	now := time.Now()
	s.status.Store(&Status{Since: now})
	if !s.cfg.JS.Conn().IsConnected() {
		// Waiting for an unreachable NATS would only delay the stop.
		s.logger.Warn("NATS is unreachable: not handing the "+s.cfg.Name+" back; a standby takes it when the lease expires", "ttl", s.cfg.TTL)
		return
	}
	// ctx is done when the seat is handed back at shutdown: the hand-back
	// gets a time of its own.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.TTL/3)
	defer cancel()
	_, err := s.cfg.JS.PublishMsg(ctx, &nats.Msg{Subject: s.cfg.Subject}, jetstream.WithExpectLastSequencePerSubject(s.rev))
	// A renewal cut short by the stop may have gone through unanswered:
	// its lease is adopted, as a renewal's or a write's would be.
	if isWrongLastSequence(err) && s.adoptLocked(ctx) {
		_, err = s.cfg.JS.PublishMsg(ctx, &nats.Msg{Subject: s.cfg.Subject}, jetstream.WithExpectLastSequencePerSubject(s.rev))
	}
	if err != nil {
		s.logger.Warn("handing the "+s.cfg.Name+" back failed; a standby takes it when the lease expires", "err", err, "ttl", s.cfg.TTL)
		return
	}
	s.logger.Info("handed the "+s.cfg.Name+" back", "held_for", now.Sub(s.since).Round(time.Millisecond))
}

// isWrongLastSequence reports whether err is the stream's refusal of a
// compare-and-set: code 10071, or 10164 on a replicated stream.
func isWrongLastSequence(err error) bool {
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) {
		return false
	}
	return apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// Current reads the seat's lease in stream (the registry bucket's, where
// New keeps it, under wire.SeatSubject) without campaigning: its holder
// and since when, or an empty holder when the seat is vacant.
func Current(ctx context.Context, stream jetstream.Stream) (holder string, since time.Time, err error) {
	msg, err := stream.GetLastMsgForSubject(ctx, wire.SeatSubject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return "", time.Time{}, nil
	}
	if err != nil {
		return "", time.Time{}, err
	}
	l, _ := liveLease(msg)
	return l.Holder, l.Since, nil
}

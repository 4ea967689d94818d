package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Config is how a Backoff paces: the pauses are Min, Min*Factor,
// Min*Factor², ..., none above Max, each jittered.
type Config struct {
	// Min is the first pause, and the first after Reset. Zero or less
	// never pauses.
	Min time.Duration
	// Max is the longest pause; one below Min is taken as Min.
	Max time.Duration
	// Factor is what each pause is the last one times; below 1 (or NaN) is
	// taken as 1: every pause Min.
	Factor float64
	// Jitter is the share of a pause drawn at random: a pause of nominal
	// length p lasts between p*(1-Jitter) and p, uniformly, so that
	// instances that failed together do not try again together. Zero
	// pauses exactly p; it is taken within [0, 1], NaN as 0.
	Jitter float64
}

// Backoff is the pause of one retry loop. It is for one goroutine at a
// time: each loop makes its own with New.
type Backoff struct {
	cfg Config
	// next is the nominal length of the next pause, before jitter.
	next time.Duration
	// draw returns a random duration in [0, n): rand.N, but in tests.
	draw func(n time.Duration) time.Duration
}

// New returns a Backoff whose next pause is cfg.Min.
func New(cfg Config) *Backoff {
	cfg.Min = max(cfg.Min, 0)
	cfg.Max = max(cfg.Max, cfg.Min)
	if !(cfg.Factor >= 1) { // NaN too
		cfg.Factor = 1
	}
	if !(cfg.Jitter > 0) {
		cfg.Jitter = 0
	}
	cfg.Jitter = min(cfg.Jitter, 1)
	return &Backoff{cfg: cfg, next: cfg.Min, draw: rand.N[time.Duration]}
}

// Next returns how long to pause now, jittered, and grows the pause after
// it by Factor, up to Max.
func (b *Backoff) Next() time.Duration {
	p := b.next
	if g := float64(p) * b.cfg.Factor; g >= float64(b.cfg.Max) {
		b.next = b.cfg.Max
	} else {
		b.next = time.Duration(g)
	}
	span := time.Duration(float64(p) * b.cfg.Jitter)
	if span <= 0 {
		return p
	}
	return p - span + b.draw(span+1)
}

// Reset makes the next pause Min again: the loop's attempt succeeded, and
// its next failure starts a new streak.
func (b *Backoff) Reset() { b.next = b.cfg.Min }

// Wait pauses for Next, and reports false if ctx is done first (or was
// already).
func (b *Backoff) Wait(ctx context.Context) bool { return Sleep(ctx, b.Next()) }

// Sleep pauses for d, and reports false if ctx is done first (or was
// already): Wait, for a loop that draws its pause from Next first, to log
// it.
func Sleep(ctx context.Context, d time.Duration) bool {
	if ctx.Err() != nil {
		return false
	}
	if d <= 0 {
		return true
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

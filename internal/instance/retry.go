package instance

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/novox/mesh-provisioner/backoff"
)

// How long a start-up step pauses before it is tried again: jittered by
// half, doubling from startRetryMin to startRetryMax.
const (
	startRetryMin = 250 * time.Millisecond
	startRetryMax = 5 * time.Second
	// startAttempt bounds one attempt, so that a request sent into a
	// stream's leader election is given up and sent again.
	startAttempt = 15 * time.Second
)

// retryStart runs step until it succeeds or ctx is done: a start-up step
// that fails on what the bus causes (a JetStream request timing out during
// a leader election, a stream not yet placed) is logged and tried again, for
// no instance ends itself on anything the bus can cause.
func retryStart(ctx context.Context, logger *slog.Logger, what string, step func(ctx context.Context) error) error {
	retry := backoff.New(backoff.Config{Min: startRetryMin, Max: startRetryMax, Factor: 2, Jitter: 0.5})
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, startAttempt)
		err := step(actx)
		cancel()
		if err == nil {
			if attempt > 1 {
				logger.Info("start-up step done after retries", "step", what, "attempts", attempt)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
		pause := retry.Next()
		logger.Warn("start-up step failed; trying again", "step", what, "err", err, "attempt", attempt, "in", pause)
		if !backoff.Sleep(ctx, pause) {
			return fmt.Errorf("%s: %w", what, ctx.Err())
		}
	}
}

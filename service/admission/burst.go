package admission

import (
	"log/slog"
	"sync"
	"time"
)

// BurstQuiet is how long without a new event ends a burst.
const BurstQuiet = 5 * time.Second

// BurstLog logs a burst of events once when it starts, and once when it
// has been quiet for a while, with how many events it had: a flood of slow
// consumer reports is two lines, not one a report.
type BurstLog struct {
	logger *slog.Logger
	msg    string
	quiet  time.Duration

	mu      sync.Mutex
	started time.Time // zero between bursts
	events  int
	subject map[string]int
	timer   *time.Timer
	stopped bool
}

// NewBurstLog returns a log of bursts of events, each logged with msg,
// a burst ending after quiet without an event.
func NewBurstLog(logger *slog.Logger, msg string, quiet time.Duration) *BurstLog {
	return &BurstLog{logger: logger, msg: msg, quiet: quiet}
}

// Event records one event on subject.
func (b *BurstLog) Event(subject string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.stopped {
		return
	}
	if b.started.IsZero() {
		b.started = time.Now()
		b.subject = map[string]int{}
		b.logger.Warn(b.msg, "subject", subject, "burst", "started")
		b.timer = time.AfterFunc(b.quiet, b.end)
	} else {
		b.timer.Reset(b.quiet)
	}
	b.events++
	b.subject[subject]++
}

// end logs the end of a burst.
func (b *BurstLog) end() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.started.IsZero() {
		return
	}
	b.logger.Warn(b.msg, "burst", "ended", "reports", b.events, "by_subject", b.subject,
		"lasted", time.Since(b.started).Round(time.Millisecond))
	b.started, b.events, b.subject = time.Time{}, 0, nil
}

// Stop logs a burst in progress and ignores further events.
func (b *BurstLog) Stop() {
	b.mu.Lock()
	b.stopped = true
	t := b.timer
	b.mu.Unlock()
	if t != nil && t.Stop() {
		b.end()
	}
}

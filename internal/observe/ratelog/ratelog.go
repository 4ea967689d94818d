// Package ratelog logs what a node, a provider or any asker can cause at
// most once a period per cause and asker, with the count of the lines it
// kept back: a flood of one cause is a line a minute, not a line a try.
package ratelog

import (
	"log/slog"
	"sync"
	"time"
)

// Period is how often a cause is logged for one asker by default.
const Period = time.Minute

// maxKeys bounds the (cause, asker) pairs remembered: past it, a new
// asker's lines are kept back under its cause alone, so that askers an
// attacker makes up (a need naming a thousand providers) cannot grow the
// map without bound.
const maxKeys = 4096

type key struct{ cause, asker string }

type entry struct {
	logged   time.Time // when the last line was written
	keptBack int       // lines not written since
}

// Limiter decides which lines are written. Its zero value is not usable:
// make one with New.
type Limiter struct {
	logger *slog.Logger
	period time.Duration
	now    func() time.Time

	mu       sync.Mutex
	entries  map[key]*entry
	forgotAt time.Time // the last look for pairs to forget
}

// New returns a Limiter that writes to logger at most one line a period
// per cause and asker.
func New(logger *slog.Logger, period time.Duration) *Limiter {
	return &Limiter{logger: logger, period: period, now: time.Now, entries: map[key]*entry{}}
}

// Log writes msg at level with args unless a line of the same cause and
// asker was written within the period; a line written after some were kept
// back says how many ("kept_back"). The asker is logged as "asker" when not
// empty. Like slog's Warn and Error, it takes no context: the lines it
// writes are about the process, not a request.
func (l *Limiter) Log(level slog.Level, cause, asker, msg string, args ...any) {
	keptBack, ok := l.allow(cause, asker)
	if !ok {
		return
	}
	if asker != "" {
		args = append(args, "asker", asker)
	}
	if keptBack > 0 {
		args = append(args, "kept_back", keptBack)
	}
	switch {
	case level >= slog.LevelError:
		l.logger.Error(msg, args...)
	case level >= slog.LevelWarn:
		l.logger.Warn(msg, args...)
	case level >= slog.LevelInfo:
		l.logger.Info(msg, args...)
	default:
		l.logger.Debug(msg, args...)
	}
}

// allow reports whether a line of cause and asker is written now, and how
// many were kept back since the last.
func (l *Limiter) allow(cause, asker string) (keptBack int, ok bool) {
	now := l.now()
	l.mu.Lock()
	defer l.mu.Unlock()
	k := key{cause, asker}
	e := l.entries[k]
	if e == nil {
		if len(l.entries) >= maxKeys && now.Sub(l.forgotAt) >= l.period {
			l.forget(now)
		}
		if len(l.entries) >= maxKeys {
			k = key{cause: cause}
			e = l.entries[k]
		}
		if e == nil {
			l.entries[k] = &entry{logged: now}
			return 0, true
		}
	}
	if now.Sub(e.logged) < l.period {
		e.keptBack++
		return 0, false
	}
	keptBack, e.logged, e.keptBack = e.keptBack, now, 0
	return keptBack, true
}

// forget drops the pairs with nothing kept back whose last line is a period
// old (the next line of theirs is written anyway); it looks once a period
// at most.
func (l *Limiter) forget(now time.Time) {
	l.forgotAt = now
	for k, e := range l.entries {
		if e.keptBack == 0 && now.Sub(e.logged) >= l.period {
			delete(l.entries, k)
		}
	}
}

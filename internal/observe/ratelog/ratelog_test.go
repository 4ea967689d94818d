package ratelog

import (
	"bytes"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestLimiterWritesALineAPeriodPerCauseAndAsker(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{ReplaceAttr: dropTime})), time.Minute)
	clock := time.Unix(0, 0)
	l.now = func() time.Time { return clock }

	for range 100 {
		l.Log(slog.LevelWarn, "refused reply", "ace", "not answered")
		l.Log(slog.LevelWarn, "refused reply", "bob", "not answered")
		l.Log(slog.LevelError, "permission violation", "", "refused")
	}
	clock = clock.Add(59 * time.Second)
	l.Log(slog.LevelWarn, "refused reply", "ace", "not answered")
	clock = clock.Add(time.Second)
	l.Log(slog.LevelWarn, "refused reply", "ace", "not answered")

	want := strings.Join([]string{
		`level=WARN msg="not answered" asker=ace`,
		`level=WARN msg="not answered" asker=bob`,
		`level=ERROR msg=refused`,
		`level=WARN msg="not answered" asker=ace kept_back=100`,
		``,
	}, "\n")
	if got := out.String(); got != want {
		t.Errorf("lines:\n%s\nwant:\n%s", got, want)
	}
}

func TestLimiterKeepsItsMemoryBounded(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	l := New(slog.New(slog.NewTextHandler(&out, nil)), time.Minute)
	for i := range 10 * maxKeys {
		l.Log(slog.LevelWarn, "cannot follow a provider's bucket", fmt.Sprintf("made-up-%d", i), "cannot follow")
	}
	if n := len(l.entries); n > maxKeys+1 {
		t.Errorf("%d pairs remembered, want at most %d", n, maxKeys+1)
	}
	if lines := strings.Count(out.String(), "\n"); lines > maxKeys+1 {
		t.Errorf("%d lines for %d made-up askers, want at most %d", lines, 10*maxKeys, maxKeys+1)
	}
}

func dropTime(_ []string, a slog.Attr) slog.Attr {
	if a.Key == slog.TimeKey {
		return slog.Attr{}
	}
	return a
}

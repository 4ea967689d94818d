package backoff

import (
	"context"
	"math"
	"testing"
	"time"
)

const ms = time.Millisecond

// With no jitter, each Next is the pause's nominal length.
func TestNextGrowsByFactorToMax(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []time.Duration
	}{
		{"doubling to a cap", Config{Min: 100 * ms, Max: 2 * time.Second, Factor: 2},
			[]time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 2 * time.Second, 2 * time.Second}},
		{"a cap reached exactly", Config{Min: 250 * ms, Max: 1 * time.Second, Factor: 2},
			[]time.Duration{250 * ms, 500 * ms, time.Second, time.Second}},
		{"a factor of one and a half", Config{Min: 100 * ms, Max: time.Second, Factor: 1.5},
			[]time.Duration{100 * ms, 150 * ms, 225 * ms, 337500 * time.Microsecond, 506250 * time.Microsecond, 759375 * time.Microsecond, time.Second}},
		{"a factor below one is one", Config{Min: 100 * ms, Max: time.Second, Factor: 0.5},
			[]time.Duration{100 * ms, 100 * ms, 100 * ms}},
		{"no factor is one", Config{Min: 100 * ms, Max: time.Second},
			[]time.Duration{100 * ms, 100 * ms}},
		{"a NaN factor is one", Config{Min: 100 * ms, Max: time.Second, Factor: math.NaN()},
			[]time.Duration{100 * ms, 100 * ms}},
		{"a max below min is min", Config{Min: 100 * ms, Max: 10 * ms, Factor: 2},
			[]time.Duration{100 * ms, 100 * ms}},
		{"no min never pauses", Config{Max: time.Second, Factor: 2},
			[]time.Duration{0, 0, 0}},
		{"a negative min never pauses", Config{Min: -ms, Max: time.Second, Factor: 2},
			[]time.Duration{0, 0}},
		{"an infinite factor jumps to the cap", Config{Min: ms, Max: time.Hour, Factor: math.Inf(1)},
			[]time.Duration{ms, time.Hour, time.Hour}},
		{"a cap near the largest duration does not overflow", Config{Min: time.Hour, Max: math.MaxInt64, Factor: 1e6},
			[]time.Duration{time.Hour, 1e6 * time.Hour, math.MaxInt64, math.MaxInt64}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := New(tt.cfg)
			for i, want := range tt.want {
				if got := b.Next(); got != want {
					t.Fatalf("pause %d: got %v, want %v", i, got, want)
				}
			}
		})
	}
}

func TestResetStartsAgainFromMin(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		cfg    Config
		before int // pauses drawn before Reset
	}{
		{"at once", Config{Min: 50 * ms, Max: time.Second, Factor: 2}, 0},
		{"mid streak", Config{Min: 50 * ms, Max: time.Second, Factor: 2}, 3},
		{"at the cap", Config{Min: 50 * ms, Max: time.Second, Factor: 2}, 10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			b := New(tt.cfg)
			for range tt.before {
				b.Next()
			}
			b.Reset()
			if got := b.Next(); got != tt.cfg.Min {
				t.Fatalf("after Reset: got %v, want %v", got, tt.cfg.Min)
			}
			if got, want := b.Next(), 2*tt.cfg.Min; got != want {
				t.Fatalf("the pause after: got %v, want %v", got, want)
			}
		})
	}
}

func TestJitterStaysWithinItsShareOfThePause(t *testing.T) {
	t.Parallel()
	lowest := func(time.Duration) time.Duration { return 0 }
	highest := func(n time.Duration) time.Duration { return n - 1 }
	tests := []struct {
		name   string
		jitter float64
		draw   func(time.Duration) time.Duration // nil: math/rand
		// low says the pauses are the lowest the jitter allows, high the
		// nominal ones; neither, anywhere between.
		low, high bool
	}{
		{"half, lowest draw", 0.5, lowest, true, false},
		{"half, highest draw", 0.5, highest, false, true},
		{"half, random", 0.5, nil, false, false},
		{"a quarter, lowest draw", 0.25, lowest, true, false},
		{"a quarter, random", 0.25, nil, false, false},
		{"whole, lowest draw", 1, lowest, true, false},
		{"whole, random", 1, nil, false, false},
		{"above one is whole", 3, lowest, true, false},
		{"none", 0, nil, true, true},
		{"negative is none", -1, lowest, true, true},
		{"NaN is none", math.NaN(), lowest, true, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{Min: 250 * ms, Max: 5 * time.Second, Factor: 2, Jitter: tt.jitter}
			share := min(max(tt.jitter, 0), 1)
			if math.IsNaN(tt.jitter) {
				share = 0
			}
			b := New(cfg)
			if tt.draw != nil {
				b.draw = tt.draw
			}
			nominal := cfg.Min
			for i := range 1000 {
				lo := nominal - time.Duration(float64(nominal)*share)
				got := b.Next()
				if got < lo || got > nominal {
					t.Fatalf("pause %d of nominal %v: got %v, want within [%v, %v]", i, nominal, got, lo, nominal)
				}
				if tt.low && got != lo {
					t.Fatalf("pause %d of nominal %v: got %v, want the lowest, %v", i, nominal, got, lo)
				}
				if tt.high && got != nominal {
					t.Fatalf("pause %d of nominal %v: got %v, want the nominal pause", i, nominal, got)
				}
				// The jitter does not feed the growth.
				nominal = min(2*nominal, cfg.Max)
			}
		})
	}
}

// TestJitterIsDrawnOverTheWholeShare fails if the random pauses bunch:
// pauses of 5s jittered by half land in every tenth of [2.5s, 5s].
func TestJitterIsDrawnOverTheWholeShare(t *testing.T) {
	t.Parallel()
	b := New(Config{Min: 5 * time.Second, Max: 5 * time.Second, Factor: 2, Jitter: 0.5})
	var seen [10]int
	for range 10_000 {
		p := b.Next()
		seen[min(int((p-2500*ms)*10/(2500*ms)), 9)]++
	}
	for i, n := range seen {
		if n < 500 { // 1,000 expected
			t.Fatalf("the %d-th tenth of the share drew %d of 10,000 pauses: %v", i, n, seen)
		}
	}
}

func TestWaitEndsWithItsContext(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		min    time.Duration
		cancel time.Duration // after this long; negative: before Wait
		want   bool
		within time.Duration
	}{
		{"a pause that ends", 10 * ms, time.Hour, true, 5 * time.Second},
		{"no pause", 0, time.Hour, true, 5 * time.Second},
		{"cancelled before", time.Hour, -1, false, 5 * time.Second},
		{"cancelled before, no pause", 0, -1, false, 5 * time.Second},
		{"cancelled during", time.Hour, 10 * ms, false, 5 * time.Second},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithCancel(t.Context())
			defer cancel()
			if tt.cancel < 0 {
				cancel()
			} else {
				stop := time.AfterFunc(tt.cancel, cancel)
				defer stop.Stop()
			}
			b := New(Config{Min: tt.min, Max: tt.min, Factor: 2})
			start := time.Now()
			if got := b.Wait(ctx); got != tt.want {
				t.Fatalf("Wait: got %v, want %v", got, tt.want)
			}
			took := time.Since(start)
			if took > tt.within {
				t.Fatalf("Wait took %v, want at most %v", took, tt.within)
			}
			if tt.want && took < tt.min {
				t.Fatalf("Wait took %v, less than the pause, %v", took, tt.min)
			}
		})
	}
}

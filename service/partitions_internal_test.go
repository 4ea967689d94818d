package service

import "testing"

// A partition is shut out past what one asker may ask a read verb between
// two weighings, at least minFlood: with no bound on reads, the write
// verbs' rate; with none at all, the default (the doors still drop what
// their lines have no room for).
func TestFloodAt(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		rate, writeRate int
		want            uint64
	}{
		{DefaultMaxRatePerAsker, DefaultMaxWriteRatePerAsker, 1_001},
		{200, DefaultMaxWriteRatePerAsker, minFlood + 1},
		{1, 1, minFlood + 1},
		{0, 5_000, 501},
		{NoLimit, 5_000, 501},
		{NoLimit, NoLimit, 1_001},
	} {
		if got := floodAt(tc.rate, tc.writeRate); got != tc.want {
			t.Errorf("floodAt(%d, %d) = %d, want %d", tc.rate, tc.writeRate, got, tc.want)
		}
	}
}

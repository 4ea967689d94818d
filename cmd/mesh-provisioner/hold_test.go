package main

import (
	"slices"
	"strings"
	"testing"
)

// --hold reads partitions and ranges of them, of the --partitions the mesh
// has, and says what to fix in anything else.
func TestParseHold(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		text       string
		partitions int
		want       []int
		share      bool
		err        string
	}{
		{text: "", partitions: 0},
		{text: "", partitions: 8},
		{text: "3", partitions: 8, want: []int{3}},
		{text: "0-3", partitions: 8, want: []int{0, 1, 2, 3}},
		{text: "6, 0-1,4", partitions: 8, want: []int{0, 1, 4, 6}},
		{text: "1", partitions: 0, err: "give --partitions too"},
		{text: "8", partitions: 8, err: "outside 0 to 7"},
		{text: "-1", partitions: 8, err: "neither a partition nor a range"},
		{text: "3-1", partitions: 8, err: "neither a partition nor a range"},
		{text: "a", partitions: 8, err: "neither a partition nor a range"},
		{text: "0-2,2", partitions: 8, err: "partition 2 is listed twice"},
		{text: "auto", partitions: 8, share: true},
		{text: "auto", partitions: 0, err: "give --partitions too"},
		{text: "auto,1", partitions: 8, err: "neither a partition nor a range"},
	} {
		t.Run(tt.text, func(t *testing.T) {
			t.Parallel()
			got, share, err := parseHold(tt.text, tt.partitions)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("parseHold(%q, %d) = %v, %v; want an error saying %q", tt.text, tt.partitions, got, err, tt.err)
				}
				return
			}
			if err != nil || !slices.Equal(got, tt.want) || share != tt.share {
				t.Errorf("parseHold(%q, %d) = %v, %v, %v; want %v, %v", tt.text, tt.partitions, got, share, err, tt.want, tt.share)
			}
		})
	}
}

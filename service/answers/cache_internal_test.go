package answers

import (
	"fmt"
	"slices"
	"testing"
)

// The answer cache keeps to its byte budget, the least recently used out
// first, and spares once an entry hit since it was last passed over.
func TestAnswerCacheEvictsTheLeastRecentlyUsed(t *testing.T) {
	t.Parallel()
	key := func(i int) CacheKey { return CacheKey{endpoint: "provisioning", request: fmt.Sprintf("r%02d", i)} }
	data := make([]byte, 100)
	size := entrySize(key(0), len(data))
	c := newAnswerCache(8 * size) // eight answers of this size
	st := Stamp{registry: 1}
	kept := func() []int {
		var out []int
		for i := range 20 {
			if _, ok := c.entries[key(i)]; ok {
				out = append(out, i)
			}
		}
		return out
	}
	check := func(when string, want ...int) {
		t.Helper()
		if got := kept(); !slices.Equal(got, want) {
			t.Errorf("%s: kept %v, want %v", when, got, want)
		}
		if c.bytes != len(want)*size || c.bytes > c.limit || c.order.Len() != len(c.entries) {
			t.Errorf("%s: %d bytes in %d entries (%d in order), want %d, at most the limit %d", when, c.bytes, len(c.entries), c.order.Len(), len(want)*size, c.limit)
		}
	}

	for i := range 8 {
		if c.put(key(i), st, data) == nil {
			t.Fatalf("answer %d of %d bytes not kept under a limit of %d", i, size, c.limit)
		}
	}
	check("full", 0, 1, 2, 3, 4, 5, 6, 7)

	// The oldest goes first.
	c.put(key(8), st, data)
	check("one more", 1, 2, 3, 4, 5, 6, 7, 8)

	// A hit spares the oldest once: the next oldest goes instead.
	if _, ok := c.get(key(1), st); !ok {
		t.Fatal("a kept answer missed")
	}
	c.put(key(9), st, data)
	check("after a hit on the oldest", 1, 3, 4, 5, 6, 7, 8, 9)
	// Spared once only: unless hit again, it goes when it is the oldest
	// again.
	for i := 10; i < 17; i++ {
		c.put(key(i), st, data)
	}
	check("seven more", 1, 10, 11, 12, 13, 14, 15, 16)
	c.put(key(17), st, data)
	check("eight more", 10, 11, 12, 13, 14, 15, 16, 17)

	// Replacing a key's answer counts it once.
	c.put(key(17), Stamp{registry: 2}, data)
	check("replaced", 10, 11, 12, 13, 14, 15, 16, 17)
	if _, ok := c.get(key(17), st); ok {
		t.Error("an answer was reused for another stamp")
	}
	if _, ok := c.get(key(17), Stamp{registry: 2}); !ok {
		t.Error("the replacing answer missed")
	}

	// An answer over an eighth of the budget is not kept, and pushes none
	// out.
	if c.put(key(18), st, make([]byte, c.limit/16)) != nil {
		t.Error("an answer over an eighth of the budget was kept")
	}
	check("too large", 10, 11, 12, 13, 14, 15, 16, 17)

	// No budget: nothing is kept, nothing hits.
	none := newAnswerCache(0)
	if none.put(key(0), st, data) != nil {
		t.Error("a cache without a budget kept an answer")
	}
	if _, ok := none.get(key(0), st); ok {
		t.Error("a cache without a budget hit")
	}
}

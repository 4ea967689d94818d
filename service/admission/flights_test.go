package admission

import "testing"

// A flight is joined at its stamp only, while fewer requests than the bound
// wait on every flight, and its builder's land hands every waiter the
// body, once.
func TestFlightsJoin(t *testing.T) {
	t.Parallel()
	f := NewFlights[string, int](2)
	key := "compose a"
	var got []string
	wait := func(body []byte) { got = append(got, string(body)) }
	joined, land := f.Join(key, 1, wait)
	if joined || land == nil {
		t.Fatalf("the first request joined (%v) or does not build (land %v)", joined, land != nil)
	}
	for i, want := range []bool{true, true, false} { // the third is over the bound
		if i == 2 {
			other := "compose b"
			if j, l := f.Join(other, 0, wait); j || l == nil {
				t.Fatalf("another request joined (%v) or does not build (land %v)", j, l != nil)
			}
			if j, _ := f.Join(other, 0, wait); j {
				t.Error("another flight was joined while the bound's requests wait on the first")
			}
		}
		if j, l := f.Join(key, 1, wait); j != want || l != nil {
			t.Errorf("request %d at the same stamp: joined %v, land %v; want joined %v, no land", i+2, j, l != nil, want)
		}
	}
	if j, l := f.Join(key, 2, wait); j || l != nil {
		t.Errorf("a request at another stamp: joined %v, land %v; want neither", j, l != nil)
	}
	land([]byte("answer"))
	if len(got) != 2 || got[0] != "answer" || got[1] != "answer" {
		t.Errorf("waiters got %q, want the body twice", got)
	}
	if joined, land := f.Join(key, 1, wait); joined || land == nil {
		t.Errorf("after landing, a request joined (%v) or does not build (land %v)", joined, land != nil)
	}
}

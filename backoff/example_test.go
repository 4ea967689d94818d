package backoff_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/novox/mesh-provisioner/backoff"
)

// The pauses double from Min to Max, and start over after Reset.
func Example() {
	b := backoff.New(backoff.Config{Min: 100 * time.Millisecond, Max: time.Second, Factor: 2})
	for range 6 {
		fmt.Print(b.Next(), " ")
	}
	b.Reset()
	fmt.Println("reset", b.Next())
	// Output: 100ms 200ms 400ms 800ms 1s 1s reset 100ms
}

// A loop tries a step again until it succeeds or its context is done.
func ExampleBackoff_Wait() {
	ctx := context.Background()
	b := backoff.New(backoff.Config{Min: time.Millisecond, Max: 4 * time.Millisecond, Factor: 2})
	attempts := 0
	step := func() error {
		if attempts++; attempts < 3 {
			return errors.New("not yet")
		}
		return nil
	}
	for {
		err := step()
		if err == nil {
			break
		}
		fmt.Println("attempt", attempts, "failed:", err)
		if !b.Wait(ctx) {
			return
		}
	}
	fmt.Println("done after", attempts, "attempts")
	// Output:
	// attempt 1 failed: not yet
	// attempt 2 failed: not yet
	// done after 3 attempts
}

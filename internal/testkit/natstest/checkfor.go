package natstest

import (
	"testing"
	"time"
)

// CheckFor calls check until it returns nil, every 10ms, and fails the test
// with check's last error once timeout has passed: the shape of
// nats-server's own checkFor, for tests that wait on something
// asynchronous they cannot be told of.
func CheckFor(t testing.TB, timeout time.Duration, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %s: %v", timeout, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

//go:build !unix

package main

import (
	"errors"
	"fmt"
)

// stateLock is never held here: see lockStateDir.
type stateLock struct{}

// ErrStateDirLockUnsupported: this platform has no lock of the state
// directory (flock(2) is unix-only).
var ErrStateDirLockUnsupported = errors.New("locking the state directory is not supported on this platform")

// lockStateDir refuses: without the lock a second instance on the same
// directory would run a second nats-server on one JetStream store and
// corrupt it, and serving without that guard is worse than not serving.
// So embedded mode is unix-only; elsewhere the command still builds, and
// serve --nats-url (a nats-server run on its own) and every other command
// work.
func lockStateDir(dir string) (*stateLock, error) {
	return nil, fmt.Errorf("--state-dir %s: %w; run a nats-server with JetStream and serve with --nats-url", dir, ErrStateDirLockUnsupported)
}

// release has nothing to give up: lockStateDir never returns a lock here.
func (*stateLock) release() {}

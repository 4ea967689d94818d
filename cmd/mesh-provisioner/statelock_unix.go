//go:build unix

package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// ErrStateDirInUse: another process holds the lock of the state directory.
// One embedded nats-server owns a JetStream store; two would corrupt it.
var ErrStateDirInUse = errors.New("the state directory is in use")

// lockFileName is the lock file in --state-dir. It holds the PID of the
// process holding the lock, for the error of the next one to try.
const lockFileName = "mesh-provisioner.lock"

// stateLock is an exclusive flock on a state directory's lock file. The
// kernel releases it when the process ends, however it ends: a lock file
// left behind by a dead process never blocks. flock(2) is unix's: other
// platforms refuse to lock (statelock_other.go).
type stateLock struct{ file *os.File }

// lockStateDir takes the lock of dir, or fails at once with
// ErrStateDirInUse naming the PID that holds it.
func lockStateDir(dir string) (*stateLock, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("--state-dir %s: %w", dir, err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		defer func() { _ = f.Close() }()
		if errors.Is(err, unix.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = fmt.Sprintf("process %d", pid)
				}
			}
			return nil, fmt.Errorf("%w: %s holds the lock of --state-dir %s; run one instance per state directory, or give this one another --state-dir",
				ErrStateDirInUse, holder, dir)
		}
		return nil, fmt.Errorf("--state-dir %s: lock %s: %w", dir, path, err)
	}
	// The lock is held: the PID is ours to write.
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	}
	return &stateLock{file: f}, nil
}

// release gives the lock up. The file stays: removing it would let a third
// process lock a new file while a second still waits on the old one.
func (l *stateLock) release() {
	_ = unix.Flock(int(l.file.Fd()), unix.LOCK_UN)
	_ = l.file.Close()
}

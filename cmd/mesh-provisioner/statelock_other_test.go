//go:build !unix

package main

import (
	"errors"
	"testing"
)

func TestStateDirLockIsRefusedWhereUnsupported(t *testing.T) {
	t.Parallel()
	if _, err := lockStateDir(t.TempDir()); !errors.Is(err, ErrStateDirLockUnsupported) {
		t.Fatalf("lockStateDir: %v, want ErrStateDirLockUnsupported", err)
	}
}

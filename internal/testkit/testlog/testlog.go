// Package testlog is a log destination that a test shares with the
// goroutines of what it tests: slog.New(slog.NewTextHandler(&buf, nil)),
// then what was logged, whole, with String.
package testlog

import (
	"bytes"
	"sync"
)

// Buffer collects what many goroutines write. The zero value is ready.
type Buffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

// Write appends p.
func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// String returns everything written so far.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

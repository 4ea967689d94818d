package service

import "time"

// SetEarlyReadsPerSecond sets the bound on reads of a node alone while the
// copy loads (earlyReadsPerSecond) for a test, which needs one under what
// its machine reads to see the bound and not the machine.
func (c *Config) SetEarlyReadsPerSecond(n int) { c.earlyReadsPerSecond = n }

// SetReleaseGrace sets how long a partition let go stays in the copy
// (releaseGrace), for a test that waits for it to go.
func (c *Config) SetReleaseGrace(d time.Duration) { c.releaseGrace = d }

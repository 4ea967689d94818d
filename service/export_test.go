package service

// SetEarlyReadsPerSecond sets the bound on reads of a node alone while the
// copy loads (earlyReadsPerSecond) for a test, which needs one under what
// its machine reads to see the bound and not the machine.
func (c *Config) SetEarlyReadsPerSecond(n int) { c.earlyReadsPerSecond = n }

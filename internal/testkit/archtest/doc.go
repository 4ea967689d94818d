// Package archtest holds no code: its test checks the import rules that
// docs/architecture.md states (which floor of the module may import which),
// on what `go list` reports of every package of the module.
package archtest

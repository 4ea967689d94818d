//go:build faults && race

package faults_test

// raceEnabled: the race detector slows everything several times over, so
// the scenarios' speed claims (the freshness and recovery bounds,
// the seat's vacancy goal, the p99 of ordinary requests beside a non-reader)
// are measured and logged but not held to their bounds; what must happen at
// all is still waited for, with a deadline.
const raceEnabled = true

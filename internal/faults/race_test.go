//go:build faults && race

package faults_test

// raceEnabled: the race detector slows everything several times over, so
// the flood's recovery is measured and logged but not held to the bound.
const raceEnabled = true

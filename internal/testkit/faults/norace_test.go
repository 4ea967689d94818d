//go:build faults && !race

package faults_test

const raceEnabled = false

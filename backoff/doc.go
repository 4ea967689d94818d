// Package backoff paces a loop that tries again: each pause grows by a
// factor from a least to a most, drawn at random below its nominal length
// when jittered, and starts over from the least on Reset. Every retry loop
// of the module paces itself with it: serve's start-up steps, the
// registry's reconciler, the plans' writer, the copy's watchers and
// client.WatchPlan. nats.go paces its own reconnects.
//
// It imports nothing but the standard library, so that the Go client links
// it and no server code.
package backoff

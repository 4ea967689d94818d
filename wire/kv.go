package wire

import (
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// The header of a KV delete marker, as jetstream's Delete writes it.
const (
	KVOperationHeader = "KV-Operation"
	KVOperationDelete = "DEL"
)

// KVRemoves reports whether a KV message's headers say it removes its key:
// a delete or purge marker, written by a client (KV-Operation) or by the
// server (a marker's reason).
func KVRemoves(h nats.Header) bool {
	if len(h) == 0 {
		return false
	}
	switch h.Get(KVOperationHeader) {
	case KVOperationDelete, "PURGE":
		return true
	}
	switch h.Get(jetstream.MarkerReasonHeader) {
	case "MaxAge", "Purge", "Remove":
		return true
	}
	return false
}

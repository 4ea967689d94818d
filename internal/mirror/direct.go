package mirror

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/wire"
)

// A node's keys are read, for an answer while the copy loads (ReadNode),
// by one batch direct get of the last message on each of its subjects
// (nats-server's multi_last). nats-server answers a direct get from a
// client as it reads it, on the asker's connection, and a multi_last is a
// snapshot of the stream, with the sequence it was read at. A stream info
// and a KV watcher go through its JetStream API's queue instead: as many
// workers as cores, which, while instances load a large mesh, make
// consumers of every key's last value that each take a second. Reads of
// one node behind them timed out, and a node's first answer waited for the
// whole copy of its partition (bench-scale, 100,000 nodes, four instances).
//
// The direct get is written here on a nats.go subscription rather than
// with orbit.go's jetstreamext.GetLastMsgsFor, which hides the end of the
// batch: its Nats-UpTo-Sequence is the revision the read is at.

// errNotInOneBatch says a node's keys were not read by one batch direct
// get: the stream answers no direct get, more keys match than nats-server
// returns at once (1,024), their values are more than the bytes asked, or
// a replica behind another answered. They are read through a watcher.
var errNotInOneBatch = errors.New("not read in one batch direct get")

// errNoneMatched is a batch direct get's "no results": no subject matches.
var errNoneMatched = errors.New("no key matched")

// errNoMessage says a stream holds no message at all: no direct get says
// its revision.
var errNoMessage = fmt.Errorf("%w: the stream holds no message", errNotInOneBatch)

// directMaxBytes bounds what one batch direct get of a node's keys
// brings: a node whose values are more (under a larger budget, or none)
// is read through a watcher, which nats.go flow-controls. A batch past a
// subscription's pending limit (64 MiB by default; 1,024 values of 64
// KiB reach it) would lose its end, and the read wait for it.
const directMaxBytes = 8 << 20

// Headers of a batch direct get's end (nats-server's stream.go): what it
// left unsent, and the stream's revision the batch was read at.
const (
	numPendingHeader   = "Nats-Num-Pending"
	upToSequenceHeader = "Nats-UpTo-Sequence"
)

// lastOfNode returns the last message of each of node's keys in f's bucket
// (delete markers included), oldest first, and the bucket's revision they
// were read at: every key of node's as of then. The server sends at most
// maxBytes, or directMaxBytes if less or maxBytes is not above 0; past
// it, errNotInOneBatch.
func (f *follower) lastOfNode(ctx context.Context, node string, maxBytes int) ([]*nats.Msg, uint64, error) {
	// A key that is the node's name alone is malformed, stored as written,
	// and read with the node's.
	filters := []string{f.prefix + node, f.stored.NodePrefix(node) + ">"}
	if maxBytes <= 0 || maxBytes > directMaxBytes {
		maxBytes = directMaxBytes
	}
	msgs, upTo, err := directLastOfKeys(ctx, f.js, wire.StreamOf(f.copy.Bucket()), filters, maxBytes)
	notOfNode := func(msg *nats.Msg) bool {
		subject := msg.Header.Get(jetstream.SubjectHeader)
		return subject != filters[0] && !strings.HasPrefix(subject, f.stored.NodePrefix(node))
	}
	return slices.DeleteFunc(msgs, notOfNode), upTo, err
}

// directLastOfKeys is directLast, but for keys of which none may be
// stored: "no results" does not say as of which revision, and the
// stream's last message, asked for with the keys, has it come with them.
// Messages not on filters' subjects may come: the stream's last.
func directLastOfKeys(ctx context.Context, js jetstream.JetStream, stream string, filters []string, maxBytes int) ([]*nats.Msg, uint64, error) {
	msgs, upTo, err := directLast(ctx, js, stream, filters, maxBytes)
	if !errors.Is(err, errNoneMatched) {
		return msgs, upTo, err
	}
	last, err := directLastOf(ctx, js, stream, ">")
	if err != nil {
		return nil, 0, err
	}
	msgs, upTo, err = directLast(ctx, js, stream, append(slices.Clip(filters), last), maxBytes)
	if errors.Is(err, errNoneMatched) {
		return nil, 0, fmt.Errorf("%w: a replica behind the one that answered first read none of the stream", errNotInOneBatch)
	}
	return msgs, upTo, err
}

// directLast asks stream for the last message on each subject filters
// match, in one batch direct get, and returns them, oldest first, with the
// stream's revision they were read at (the end of batch's
// Nats-UpTo-Sequence).
func directLast(ctx context.Context, js jetstream.JetStream, stream string, filters []string, maxBytes int) ([]*nats.Msg, uint64, error) {
	body, err := json.Marshal(struct {
		MultiLast []string `json:"multi_last"`
		MaxBytes  int      `json:"max_bytes,omitempty"`
	}{filters, maxBytes})
	if err != nil {
		return nil, 0, err
	}
	nc := js.Conn()
	sub, err := nc.SubscribeSync(nc.NewInbox())
	if err != nil {
		return nil, 0, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(kvread.DirectGetSubject(js, stream), sub.Subject, body); err != nil {
		return nil, 0, err
	}
	var msgs []*nats.Msg
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		if errors.Is(err, nats.ErrNoResponders) { // the stream answers no direct get
			return nil, 0, fmt.Errorf("%w: %w", errNotInOneBatch, err)
		}
		if err != nil {
			return nil, 0, fmt.Errorf("direct get of the last messages of %s: %w", strings.Join(filters, ", "), err)
		}
		switch status := msg.Header.Get("Status"); status {
		case "":
			msgs = append(msgs, msg)
		case "204": // the end of the batch
			if pending := msg.Header.Get(numPendingHeader); pending != "0" {
				return nil, 0, fmt.Errorf("%w: %s more past the %d bytes asked", errNotInOneBatch, pending, maxBytes)
			}
			upTo, err := strconv.ParseUint(msg.Header.Get(upToSequenceHeader), 10, 64)
			if err != nil {
				return nil, 0, fmt.Errorf("direct get's end of batch without its revision: %w", err)
			}
			return msgs, upTo, nil
		case "404":
			return nil, 0, errNoneMatched
		case "413": // too many results
			return nil, 0, fmt.Errorf("%w: %s %s", errNotInOneBatch, status, msg.Header.Get("Description"))
		default:
			return nil, 0, fmt.Errorf("direct get of the last messages of %s: %s %s", strings.Join(filters, ", "), status, msg.Header.Get("Description"))
		}
	}
}

// directLastOf returns the subject of stream's last message on a subject
// filter matches, by a direct get; errNotInOneBatch when there is none.
func directLastOf(ctx context.Context, js jetstream.JetStream, stream, filter string) (string, error) {
	msg, err := kvread.Last(ctx, js, stream, filter)
	switch {
	case errors.Is(err, kvread.ErrNoMessage):
		return "", errNoMessage
	case errors.Is(err, nats.ErrNoResponders):
		return "", fmt.Errorf("%w: %w", errNotInOneBatch, err)
	case err != nil:
		return "", err
	}
	return msg.Header.Get(jetstream.SubjectHeader), nil
}

// readLastDirect is the first read of a bucket of few keys
// (follower.readsDirectFirst): the last value of each of its keys, by one
// batch direct get, into the copy, which is then loaded at the revision
// they were read at; the consumer that follows the bucket starts after it
// (followOn). A consumer of every key's last value is made through
// nats-server's JetStream API queue, behind every request already in it:
// while other instances loaded a large mesh, the registry's and the
// manifests' first reads waited seconds there, and an instance answers
// nothing without them.
func (f *follower) readLastDirect(ctx context.Context) error {
	msgs, upTo, err := directLastOfKeys(ctx, f.js, wire.StreamOf(f.copy.Bucket()), []string{f.prefix + ">"}, directMaxBytes)
	switch {
	case errors.Is(err, errNoMessage):
		// Never written, or purged: nothing to hold, and the consumer
		// that follows starts at the stream's first message. A copy read
		// through a consumer is at revision 0 too.
		msgs, upTo = nil, 0
	case err != nil:
		return err
	}
	for _, msg := range msgs {
		key, ok := f.stored.Key(msg.Header.Get(jetstream.SubjectHeader))
		if !ok {
			continue // the stream's last message, not a key (directLastOfKeys)
		}
		seq, err := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
		if err != nil {
			return fmt.Errorf("direct get of %s without its revision: %w", key, err)
		}
		f.apply(key, msg.Data, seq, wire.KVRemoves(msg.Header), false)
	}
	f.copy.advance(upTo)
	f.mu.Lock()
	f.followOn = &upTo
	f.mu.Unlock()
	f.caughtUp(upTo)
	f.logger.Debug("read every key's last value by one batch direct get", "messages", len(msgs), "revision", upTo)
	return nil
}

package kvread

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoMessage says a stream stores no message on the subjects asked.
var ErrNoMessage = errors.New("no message stored on the subjects asked")

// DirectGetSubject returns the subject of stream's direct gets under js's
// API prefix (its options hold the one it was made with, if any).
func DirectGetSubject(js jetstream.JetStream, stream string) string {
	prefix := jetstream.DefaultAPIPrefix
	switch opts := js.Options(); {
	case opts.APIPrefix != "":
		prefix = strings.TrimSuffix(opts.APIPrefix, ".") + "."
	case opts.Domain != "":
		prefix = "$JS." + opts.Domain + ".API."
	}
	return prefix + "DIRECT.GET." + stream
}

// Last returns stream's last message on a subject that filter matches, by
// a direct get (last_by_subj), or ErrNoMessage. A replica of the stream
// answers it as it reads it, outside nats-server's JetStream API queue,
// and nothing is asked first, where a jetstream.Stream's
// GetLastMsgForSubject needs the stream's info (an API request, answered
// only when no other waits). The message's headers say its subject,
// sequence and time (jetstream.SubjectHeader, SequenceHeader,
// TimeStampHeaer). A stream that answers no direct get is
// nats.ErrNoResponders, wrapped.
func Last(ctx context.Context, js jetstream.JetStream, stream, filter string) (*nats.Msg, error) {
	body, err := json.Marshal(struct {
		LastBySubject string `json:"last_by_subj"`
	}{filter})
	if err != nil {
		return nil, err
	}
	msg, err := js.Conn().RequestWithContext(ctx, DirectGetSubject(js, stream), body)
	if err != nil {
		return nil, fmt.Errorf("direct get of %s's last message on %s: %w", stream, filter, err)
	}
	switch status := msg.Header.Get("Status"); status {
	case "":
		return msg, nil
	case "404":
		return nil, ErrNoMessage
	default:
		return nil, fmt.Errorf("direct get of %s's last message on %s: %s %s", stream, filter, status, msg.Header.Get("Description"))
	}
}

package kvread_test

import (
	"errors"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// Last reads the newest message on the subjects a filter matches by a
// direct get: none in an empty bucket, then the last write of the keys
// asked (a delete marker too), whichever key it was.
func TestLastReadsTheNewestMessageOnTheSubjectsAsked(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	js, err := jetstream.New(natstest.Connect(t, natstest.Start(t)))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "last"})
	if err != nil {
		t.Fatal(err)
	}
	stream := wire.StreamOf("last")
	if _, err := kvread.Last(ctx, js, stream, wire.KVSubject("last", ">")); !errors.Is(err, kvread.ErrNoMessage) {
		t.Fatalf("an empty bucket's last message: %v, want ErrNoMessage", err)
	}
	for _, key := range []string{"a.1", "b.1", "a.2"} {
		if _, err := kv.Put(ctx, key, []byte(key)); err != nil {
			t.Fatal(err)
		}
	}
	if err := kv.Delete(ctx, "b.1"); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		filter, subject string
		sequence        uint64
	}{
		{"a.>", "a.2", 3},
		{"b.1", "b.1", 4}, // its delete marker
		{">", "b.1", 4},
	} {
		msg, err := kvread.Last(ctx, js, stream, wire.KVSubject("last", tc.filter))
		if err != nil {
			t.Errorf("last of %s: %v", tc.filter, err)
			continue
		}
		subject, sequence := msg.Header.Get(jetstream.SubjectHeader), msg.Header.Get(jetstream.SequenceHeader)
		if subject != wire.KVSubject("last", tc.subject) || sequence != strconv.FormatUint(tc.sequence, 10) {
			t.Errorf("last of %s: %s at %s, want %s at %d", tc.filter, subject, sequence, tc.subject, tc.sequence)
		}
	}
	if _, err := kvread.Last(ctx, js, stream, wire.KVSubject("last", "c.>")); !errors.Is(err, kvread.ErrNoMessage) {
		t.Errorf("no key under c: %v, want ErrNoMessage", err)
	}
	if _, err := kvread.Last(ctx, js, wire.StreamOf("missing"), ">"); !errors.Is(err, nats.ErrNoResponders) {
		t.Errorf("a stream that does not exist: %v, want no responders", err)
	}
}

// DirectGetSubject is under the API prefix or domain a JetStream handle
// was made with.
func TestDirectGetSubjectFollowsTheHandlesPrefix(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	handles := []struct {
		make func() (jetstream.JetStream, error)
		want string
	}{
		{func() (jetstream.JetStream, error) { return jetstream.New(nc) }, "$JS.API.DIRECT.GET.S"},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithAPIPrefix(nc, "$JS.mesh.API") }, "$JS.mesh.API.DIRECT.GET.S"},
		{func() (jetstream.JetStream, error) { return jetstream.NewWithDomain(nc, "hub") }, "$JS.hub.API.DIRECT.GET.S"},
	}
	for _, h := range handles {
		js, err := h.make()
		if err != nil {
			t.Fatal(err)
		}
		if got := kvread.DirectGetSubject(js, "S"); got != h.want {
			t.Errorf("DirectGetSubject = %q, want %q", got, h.want)
		}
	}
}

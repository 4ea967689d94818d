package seat

import (
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// Anything an admin writes on the seat's subject that is not a live lease is
// a vacant seat: a nameable instance holds it soon (about a Poll after its lease is refused), and no
// instance reports a holder it cannot name.
func TestSeatSurvivesGarbage(t *testing.T) {
	t.Parallel()
	const ttl = 2 * time.Second
	for _, tc := range []struct {
		name   string
		data   string
		header nats.Header
	}{
		{"empty", "", nil},
		{"undecodable", "\x00\xffnot json", nil},
		{"another shape", `{"kind":"port","owner":"intruder"}`, nil},
		{"a JSON array", `["holder"]`, nil},
		{"a lease without a TTL", `{"holder":"intruder","since":"2026-01-01T00:00:00Z"}`, nil},
		{"a lease with extra fields", `{"holder":"intruder","since":"2026-01-01T00:00:00Z","x":1}`, nats.Header{"Nats-TTL": {"1h"}}},
		{"a lease with an empty holder", `{"holder":"","since":"2026-01-01T00:00:00Z"}`, nats.Header{"Nats-TTL": {"1h"}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, js := startWithBuckets(t)
			ins := []*instance{
				campaign(t, s.ClientURL(), Config{ID: "a", TTL: ttl}),
				campaign(t, s.ClientURL(), Config{ID: "b", TTL: ttl}),
			}
			waitForOneHolder(t, ins, 2*ttl)
			// The admin writes with no condition, as a purge-free overwrite
			// would.
			if _, err := js.PublishMsg(t.Context(), &nats.Msg{Subject: wire.SeatSubject, Data: []byte(tc.data), Header: tc.header}); err != nil {
				t.Fatal(err)
			}
			written := time.Now()
			// Garbage that were taken for a lease would keep the seat from
			// every instance for good (or for the hour of its TTL): five
			// TTLs tell that apart from a takeover, however slow -race makes
			// it.
			natstest.CheckFor(t, 5*ttl, func() error {
				for _, in := range ins {
					if st := in.seat.Status(); st.Holder != "" && st.Holder != "a" && st.Holder != "b" {
						t.Fatalf("instance %s reports a holder it cannot name: %q", in.seat.ID(), st.Holder)
					}
				}
				if h := holders(ins); len(h) != 1 || leaseHolder(t, h[0]) != h[0].seat.ID() {
					return fmt.Errorf("no instance holds the seat after %q was written on it", tc.data)
				}
				return nil
			})
			took := time.Since(written)
			t.Logf("seat held again %s after %s was written on it", took.Round(time.Millisecond), tc.name)
		})
	}
}

// leaseHolder returns the holder named by the seat's last message.
func leaseHolder(t *testing.T, in *instance) string {
	t.Helper()
	l, _, err := in.seat.read(t.Context())
	if err != nil {
		return ""
	}
	return l.Holder
}

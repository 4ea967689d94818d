package mirror

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// A value the read of the nodes held anew delivers is not applied over a
// later change of its key that the watcher applied meanwhile, a put or a
// delete; a key the watcher did not change, or a node not held anew, is
// as the read and the watcher leave it.
func TestAFilledValueGivesWayToTheWatchers(t *testing.T) {
	t.Parallel()
	value := func(placeholder string) []byte {
		b, err := proto.Marshal(&provisionerv1.Need{Placeholder: placeholder})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	c := New().Needs
	f := &follower{copy: c}
	fl := &fill{seen: map[string]uint64{}, adding: func(first string) bool { return first == "bob" }}
	f.fill = fl
	// The watcher, while the read lasts.
	f.apply("bob.web.port.put", value("${port:watcher}"), 7, false, false)
	f.apply("bob.web.port.deleted", nil, 8, true, false)
	f.apply("ace.web.port.http", value("${port:ace}"), 9, false, false)
	// The read, of values older than the watcher's.
	f.applyFilled(fl, "bob.web.port.put", value("${port:read}"), 3)
	f.applyFilled(fl, "bob.web.port.deleted", value("${port:read}"), 4)
	f.applyFilled(fl, "bob.web.port.unchanged", value("${port:read}"), 5)
	f.applyFilled(fl, "ace.web.port.http", value("${port:read}"), 6)

	got := map[string]string{}
	for _, node := range []string{"ace", "bob"} {
		entries, _, _ := c.Group(node)
		for _, e := range entries {
			got[e.Key] = e.Record.GetNeed().GetPlaceholder()
		}
	}
	want := map[string]string{
		"ace.web.port.http":      "${port:ace}",
		"bob.web.port.put":       "${port:watcher}",
		"bob.web.port.unchanged": "${port:read}",
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("the copy after the read and the watcher (-want +got):\n%s", diff)
	}
}

// A value the read delivers ahead of the watcher (one that lags) leaves the
// copy's revision where the watcher has it: the watcher's next changes,
// older than the value read, are still applied, not taken for applied.
func TestAFilledValueAheadOfTheWatcherLeavesItsChangesToApply(t *testing.T) {
	t.Parallel()
	c := New().Needs
	f := &follower{copy: c}
	fl := &fill{seen: map[string]uint64{}, adding: func(first string) bool { return first == "bob" }}
	f.fill = fl
	f.apply("ace.web.port.http", []byte{}, 5, false, false)
	f.applyFilled(fl, "bob.web.port.http", []byte{}, 20)
	if got := c.Revision(); got != 5 {
		t.Errorf("the copy's revision after a value read at 20: %d, want the watcher's 5", got)
	}
	f.apply("ace.web.port.lagged", []byte{}, 6, false, false) // written before the value read
	if entries, _, _ := c.Group("ace"); len(entries) != 2 {
		t.Errorf("ace's keys once the watcher delivers its change at 6: %d, want 2", len(entries))
	}
}

package wire_test

import (
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/wire"
)

func TestStoredKeys(t *testing.T) {
	t.Parallel()
	const bucket = "needs"
	byEight := wire.StoredKeys{Bucket: bucket, Partitions: 8}
	ace := wire.PartitionOf("ace", 8)
	t.Run("a transform read back", func(t *testing.T) {
		t.Parallel()
		for _, want := range []wire.StoredKeys{{Bucket: bucket}, byEight, {Bucket: bucket, Partitions: wire.MaxPartitions}} {
			got, err := wire.StoredKeysOf(bucket, want.Transform())
			if err != nil || got != want {
				t.Errorf("StoredKeysOf(%v) = %v, %v", want.Transform(), got, err)
			}
		}
	})
	t.Run("a transform of another's refused", func(t *testing.T) {
		t.Parallel()
		for _, tr := range []*jetstream.SubjectTransformConfig{
			{Source: "$KV.needs.>", Destination: "$KV.needs.x.>"},
			{Source: "$KV.needs.*.>", Destination: "$KV.needs.{{partition(8,1)}}.{{wildcard(1)}}.x.>"},
			{Source: "$KV.needs.*.*.>", Destination: "$KV.needs.{{partition(8,1)}}.{{wildcard(1)}}.>"},
			byEight.Transform(), // of another bucket
		} {
			if got, err := wire.StoredKeysOf("applied", tr); err == nil {
				t.Errorf("StoredKeysOf(%v) = %v, want an error", tr, got)
			}
		}
	})
	t.Run("keys", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			stored  wire.StoredKeys
			subject string
			key     string
		}{
			{wire.StoredKeys{Bucket: bucket}, "$KV.needs.ace.web.port.http", "ace.web.port.http"},
			{byEight, "$KV.needs.3.ace.web.port.http", "ace.web.port.http"},
			{byEight, "$KV.needs.ace", "ace"}, // a node's name alone is not transformed
		} {
			if got, ok := tc.stored.Key(tc.subject); !ok || got != tc.key {
				t.Errorf("%v.Key(%q) = %q, %v; want %q", tc.stored, tc.subject, got, ok, tc.key)
			}
		}
		if _, ok := byEight.Key("$KV.applied.3.ace.web"); ok {
			t.Error("a subject of another bucket gave a key")
		}
		if got, want := byEight.NodePrefix("ace"), "$KV.needs."+itoa(ace)+".ace."; got != want {
			t.Errorf("NodePrefix(ace) = %q, want %q", got, want)
		}
		if got, want := byEight.NodeKeys("ace"), itoa(ace)+".ace.>"; got != want {
			t.Errorf("NodeKeys(ace) = %q, want %q", got, want)
		}
		if got, want := (wire.StoredKeys{Bucket: "needs"}).NodeKeys("ace"), "ace.>"; got != want {
			t.Errorf("NodeKeys(ace) stored as written = %q, want %q", got, want)
		}
	})
	t.Run("held subjects", func(t *testing.T) {
		t.Parallel()
		held := make([]bool, 4)
		held[ace%4] = true
		var want []string
		for p := range 8 {
			if p%4 == ace%4 {
				want = append(want, "$KV.needs."+itoa(p)+".>")
			}
		}
		want = append([]string{"$KV.needs.*"}, want...)
		if diff := cmp.Diff(want, byEight.HeldSubjects(held)); diff != "" {
			t.Errorf("8 stored, 4 in the mesh (-want +got):\n%s", diff)
		}
		for name, tc := range map[string]struct {
			stored wire.StoredKeys
			held   []bool
		}{
			"stored as written":          {wire.StoredKeys{Bucket: bucket}, held},
			"a count that does not fit":  {wire.StoredKeys{Bucket: bucket, Partitions: 6}, held},
			"every partition held":       {byEight, []bool{true, true, true, true}},
			"every node (no partitions)": {byEight, nil},
		} {
			if got := tc.stored.HeldSubjects(tc.held); got != nil {
				t.Errorf("%s: %v, want nil (every key)", name, got)
			}
		}
	})
}

func itoa(n int) string { return strconv.Itoa(n) }

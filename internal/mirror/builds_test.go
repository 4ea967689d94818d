package mirror

import (
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// appliedValues are applied records' wire bytes as clients may write them,
// and as a client of a later schema, or a hostile one, may.
func appliedValues(t testing.TB) map[string][]byte {
	full, err := proto.Marshal(&provisionerv1.Applied{
		PlanDigest: "sha256:00", AppliedAt: timestamppb.New(time.Unix(1700000000, 5)),
		Placeholders: []string{"${port:http}", "${secret:token}"}, WantedBuild: "b1", NewestBuild: "b2",
	})
	if err != nil {
		t.Fatal(err)
	}
	tag := func(b []byte, num protowire.Number, typ protowire.Type) []byte {
		return protowire.AppendTag(append([]byte{}, b...), num, typ)
	}
	return map[string][]byte{
		"empty":                    nil,
		"full":                     full,
		"wanted only":              protowire.AppendString(tag(nil, 4, protowire.BytesType), "b7"),
		"repeated: the last wins":  protowire.AppendString(tag(full, 4, protowire.BytesType), "b9"),
		"unknown varint":           protowire.AppendVarint(tag(full, 90, protowire.VarintType), 1<<40),
		"unknown fixed32":          protowire.AppendFixed32(tag(full, 91, protowire.Fixed32Type), 7),
		"unknown fixed64":          protowire.AppendFixed64(tag(full, 92, protowire.Fixed64Type), 7),
		"unknown bytes":            protowire.AppendString(tag(full, 93, protowire.BytesType), "later"),
		"unknown group":            protowire.AppendTag(protowire.AppendVarint(tag(tag(full, 94, protowire.StartGroupType), 1, protowire.VarintType), 0), 94, protowire.EndGroupType),
		"a group holding field 4":  protowire.AppendTag(protowire.AppendString(tag(tag(nil, 94, protowire.StartGroupType), 4, protowire.BytesType), "inner"), 94, protowire.EndGroupType),
		"wanted as a varint":       protowire.AppendVarint(tag(full, 4, protowire.VarintType), 3),
		"newest as a fixed64":      protowire.AppendFixed64(tag(full, 5, protowire.Fixed64Type), 3),
		"builds before the others": append(protowire.AppendString(tag(protowire.AppendString(tag(nil, 5, protowire.BytesType), "n"), 4, protowire.BytesType), "w"), full...),
	}
}

// readBuilds reads in place the builds decodeApplied decodes, whatever
// else the value holds.
func TestReadBuildsReadsAsDecodeApplied(t *testing.T) {
	t.Parallel()
	for name, value := range appliedValues(t) {
		checkReadBuilds(t, name, value)
	}
}

// FuzzReadBuilds: for any value decodeApplied accepts, readBuilds reads
// the builds it decodes.
func FuzzReadBuilds(f *testing.F) {
	for _, value := range appliedValues(f) {
		f.Add(value)
	}
	f.Fuzz(func(t *testing.T, value []byte) {
		checkReadBuilds(t, "fuzzed", value)
	})
}

func checkReadBuilds(t *testing.T, name string, value []byte) {
	t.Helper()
	want, err := decodeApplied("n.web", value, 1)
	if err != nil {
		return // malformed: the copy holds no slot of it
	}
	wanted, newest := readBuilds("n.web", string(value))
	if wanted != want.GetApplied().GetWantedBuild() || newest != want.GetApplied().GetNewestBuild() {
		t.Errorf("%s: readBuilds = %q, %q; decodeApplied decodes %q, %q", name, wanted, newest, want.GetApplied().GetWantedBuild(), want.GetApplied().GetNewestBuild())
	}
}

// BuildsOf reads a node's well-formed records in module order, as they
// came while loading or not, and none of a malformed key, of a value that
// does not decode, or of another node.
func TestBuildsOfReadsTheNodesWellFormedRecords(t *testing.T) {
	t.Parallel()
	m := New()
	put := func(key string, a *provisionerv1.Applied) {
		b, err := proto.Marshal(a)
		if err != nil {
			t.Fatal(err)
		}
		m.Applied.Apply(key, b, 1, false)
	}
	put("ace.web", &provisionerv1.Applied{WantedBuild: "w1", NewestBuild: "w2"})
	put("ace.api", &provisionerv1.Applied{WantedBuild: "a1"})
	put("ace.db", &provisionerv1.Applied{PlanDigest: "sha256:00"}) // names no build
	put("ace.web.extra", &provisionerv1.Applied{WantedBuild: "x"}) // out of shape
	put("bob.web", &provisionerv1.Applied{WantedBuild: "b"})
	m.Applied.Apply("ace.bad", []byte{0xff}, 1, false) // does not decode
	for _, loaded := range []bool{false, true} {
		if loaded {
			m.Applied.MarkLoaded()
		}
		builds, _ := m.BuildsOf("ace")
		for module, want := range map[string][2]string{"web": {"w1", "w2"}, "api": {"a1", ""}, "db": {}, "bad": {}, "extra": {}, "none": {}} {
			if wanted, newest := builds.Of(module); [2]string{wanted, newest} != want {
				t.Errorf("loaded %v: builds of ace's %s = %q, %q; want %q", loaded, module, wanted, newest, want)
			}
		}
	}
}

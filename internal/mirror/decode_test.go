package mirror

import (
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// needRecord reads in place what decodeNeed decodes, or leaves it to it.
func TestNeedRecordDecodesAsDecodeNeed(t *testing.T) {
	t.Parallel()
	marshal := func(n *provisionerv1.Need) []byte {
		b, err := proto.Marshal(n)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	full := marshal(&provisionerv1.Need{Placeholder: "${port:http}", Provider: "pg", Provision: "main", Local: "db", Required: true})
	values := map[string][]byte{
		"empty":          nil,
		"full":           full,
		"unknown field":  protowire.AppendString(protowire.AppendTag(append([]byte{}, full...), 99, protowire.BytesType), "later"),
		"repeated field": protowire.AppendString(protowire.AppendTag(append([]byte{}, full...), 2, protowire.BytesType), "redis"),
		"bool as 2":      protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.VarintType), 2),
		"wrong type":     protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 7),
	}
	for name, value := range values {
		want, err := decodeNeed("n.web.port.http", value, 7)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		got := needRecord("n.web.port.http", string(value), 7)
		if !proto.Equal(got, want) {
			t.Errorf("%s: needRecord gives %v, decodeNeed %v", name, got, want)
		}
	}
}

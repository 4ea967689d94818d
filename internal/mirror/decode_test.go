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

// collectRecords reads in place what decodeCollect decodes, or leaves it to
// it.
func TestCollectRecordsDecodeAsDecodeCollect(t *testing.T) {
	t.Parallel()
	full, err := proto.Marshal(&provisionerv1.CollectItem{Value: "export A=1", Order: -3, Attributes: map[string]string{"version": "1", "os": "linux", "": "empty key"}})
	if err != nil {
		t.Fatal(err)
	}
	entry := func(fields ...any) []byte {
		var e []byte
		for i := 0; i < len(fields); i += 2 {
			e = protowire.AppendString(protowire.AppendTag(e, fields[i].(protowire.Number), protowire.BytesType), fields[i+1].(string))
		}
		return protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), e)
	}
	values := map[string][]byte{
		"empty":            nil,
		"full":             full,
		"unknown field":    protowire.AppendVarint(protowire.AppendTag(append([]byte{}, full...), 9, protowire.VarintType), 1),
		"entry value only": entry(protowire.Number(2), "v"),
		"entry key twice":  append(entry(protowire.Number(1), "k", protowire.Number(2), "a"), entry(protowire.Number(1), "k", protowire.Number(2), "b")...),
		"entry unknown":    protowire.AppendBytes(protowire.AppendTag(nil, 3, protowire.BytesType), protowire.AppendVarint(protowire.AppendTag(nil, 5, protowire.VarintType), 1)),
	}
	for name, value := range values {
		want, err := decodeCollect("n.shell.web", value, 7)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if err := checkCollect("n.shell.web", string(value)); err != nil {
			t.Errorf("%s: checkCollect says %v", name, err)
		}
		got := collectRecords(1, nil)("n.shell.web", string(value), 7)
		if !proto.Equal(got, want) {
			t.Errorf("%s: collectRecords gives %v, decodeCollect %v", name, got, want)
		}
	}
}

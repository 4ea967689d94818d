package wire

import (
	"encoding/json"
	"fmt"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// EncodeStatsData is an endpoint's "data" in $SRV.STATS as the service
// sends it: the message's JSON by its fields' proto names, every field
// present (zero counts as 0, empty lists as []), and 64-bit counts as JSON
// numbers rather than protojson's strings, as plain JSON readers (the nats
// CLI, jq, encoding/json) read counts. Every protojson reader accepts
// numbers for 64-bit fields.
func EncodeStatsData(data *provisionerv1.EndpointStatsData) (json.RawMessage, error) {
	b, err := protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: true}.Marshal(data)
	if err != nil {
		return nil, err
	}
	var tree map[string]any
	if err := json.Unmarshal(b, &tree); err != nil {
		return nil, err
	}
	numbers(data.ProtoReflect().Descriptor(), tree)
	return json.Marshal(tree)
}

// DecodeStatsData reads an endpoint's "data" in $SRV.STATS. It skips
// fields the message does not define: a newer instance may report
// statistics this version does not know, and during a rolling upgrade
// every reader reads every instance's. (The conformance runners decode
// strictly: the server writes no field it does not define.)
func DecodeStatsData(raw []byte) (*provisionerv1.EndpointStatsData, error) {
	data := &provisionerv1.EndpointStatsData{}
	if err := (protojson.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(raw, data); err != nil {
		return nil, fmt.Errorf("stats data is not a %s: %w", data.ProtoReflect().Descriptor().FullName(), err)
	}
	return data, nil
}

// numbers turns the 64-bit integers of tree, protojson's JSON of a message
// of md, from strings into numbers.
func numbers(md protoreflect.MessageDescriptor, tree map[string]any) {
	fields := md.Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		name := string(fd.Name())
		v, ok := tree[name]
		if !ok {
			continue
		}
		convert := func(v any) any {
			switch x := v.(type) {
			case map[string]any:
				if fd.Kind() == protoreflect.MessageKind {
					numbers(fd.Message(), x)
				}
			case string:
				if is64(fd.Kind()) {
					return json.Number(x)
				}
			}
			return v
		}
		if list, ok := v.([]any); ok && fd.IsList() {
			for j := range list {
				list[j] = convert(list[j])
			}
			continue
		}
		tree[name] = convert(v)
	}
}

func is64(k protoreflect.Kind) bool {
	switch k {
	case protoreflect.Int64Kind, protoreflect.Uint64Kind, protoreflect.Sint64Kind,
		protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind:
		return true
	}
	return false
}

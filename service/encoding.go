package service

import (
	"bytes"
	"mime"
	"strings"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/wire"
)

// encoding is how one request was written, and so how it is answered.
type encoding struct{ json bool }

// encodingOf reads the Content-Type header (its name in any case): JSON for
// application/json, protobuf binary for anything else. Without the header, a
// body that starts with '{' is JSON, and anything else protobuf binary.
func encodingOf(req micro.Request) encoding {
	h := req.Headers()
	values, ok := h["Content-Type"]
	for name, v := range h {
		if !ok && strings.EqualFold(name, "Content-Type") {
			values, ok = v, true // another spelling, when the usual one is absent
		}
	}
	if ok && len(values) > 0 {
		media, _, err := mime.ParseMediaType(values[0])
		return encoding{json: err == nil && media == wire.ContentTypeJSON}
	}
	return encoding{json: bytes.HasPrefix(bytes.TrimSpace(req.Data()), []byte("{"))}
}

func (e encoding) contentType() string {
	if e.json {
		return wire.ContentTypeJSON
	}
	return wire.ContentTypeProtobuf
}

// unmarshal decodes a request. Fields this server does not know are an error
// in both encodings: a filter it cannot apply must not widen the answer.
func (e encoding) unmarshal(data []byte, msg proto.Message) *wire.Error {
	name := msg.ProtoReflect().Descriptor().FullName()
	if len(bytes.TrimSpace(data)) == 0 {
		return nil // an empty body is the default request
	}
	if e.json {
		if err := protojson.Unmarshal(data, msg); err != nil {
			return wire.Errorf(wire.CodeBadRequest, "the JSON request does not decode as %s: %v", name, err)
		}
		return nil
	}
	if err := proto.Unmarshal(data, msg); err != nil {
		return wire.Errorf(wire.CodeBadRequest, "the request does not decode as protobuf %s (%v); send protobuf binary, or JSON with header Content-Type: %s", name, err, wire.ContentTypeJSON)
	}
	if unknown := msg.ProtoReflect().GetUnknown(); len(unknown) > 0 {
		return wire.Errorf(wire.CodeBadRequest, "the request holds fields %s does not define (%d bytes); it was written for another contract, or is not a protobuf request at all", name, len(unknown))
	}
	return nil
}

func (e encoding) marshal(msg proto.Message) ([]byte, error) {
	if e.json {
		return protojson.Marshal(msg)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(msg)
}

// join appends an encoded message's fields to another encoded message of
// the same type: in binary a concatenation, which protobuf reads as one
// message; in JSON the fields of both objects in one.
func (e encoding) join(data, tail []byte) []byte {
	if !e.json {
		return append(data[:len(data):len(data)], tail...)
	}
	data, tail = bytes.TrimSpace(data), bytes.TrimSpace(tail)
	if len(tail) <= 2 { // {}
		return data
	}
	if len(data) <= 2 {
		return tail
	}
	out := make([]byte, 0, len(data)+len(tail))
	out = append(out, data[:len(data)-1]...) // without its closing brace
	out = append(out, ',')
	return append(out, tail[1:]...) // without its opening brace
}

func (e encoding) headers() micro.Headers {
	return micro.Headers{"Content-Type": {e.contentType()}}
}

package service

import (
	"bytes"
	"fmt"
	"mime"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// Content types of requests and answers.
const (
	ContentTypeProtobuf = "application/protobuf"
	ContentTypeJSON     = "application/json"
)

// encoding is how one request was written, and so how it is answered.
type encoding struct{ json bool }

// encodingOf reads JSON where the request says Content-Type: application/json
// or its body starts with '{'; protobuf binary otherwise.
func encodingOf(req micro.Request) encoding {
	if ct := req.Headers().Get("Content-Type"); ct != "" {
		if media, _, err := mime.ParseMediaType(ct); err == nil && media == ContentTypeJSON {
			return encoding{json: true}
		}
	}
	return encoding{json: bytes.HasPrefix(bytes.TrimLeft(req.Data(), " \t\r\n"), []byte("{"))}
}

func (e encoding) contentType() string {
	if e.json {
		return ContentTypeJSON
	}
	return ContentTypeProtobuf
}

// unmarshal decodes a request. Fields this server does not know are an error
// in both encodings: a filter it cannot apply must not widen the answer.
func (e encoding) unmarshal(data []byte, msg proto.Message) *codedError {
	name := msg.ProtoReflect().Descriptor().FullName()
	if len(bytes.TrimSpace(data)) == 0 {
		return nil // an empty body is the default request
	}
	if e.json {
		if err := protojson.Unmarshal(data, msg); err != nil {
			return badRequest(fmt.Sprintf("the JSON request does not decode as %s: %v", name, err))
		}
		return nil
	}
	if err := proto.Unmarshal(data, msg); err != nil {
		return badRequest(fmt.Sprintf("the request does not decode as protobuf %s (%v); send protobuf binary, or JSON with header Content-Type: %s", name, err, ContentTypeJSON))
	}
	if unknown := msg.ProtoReflect().GetUnknown(); len(unknown) > 0 {
		return badRequest(fmt.Sprintf("the request holds fields %s does not define (%d bytes); it was written for another contract, or is not a protobuf request at all", name, len(unknown)))
	}
	return nil
}

func (e encoding) marshal(msg proto.Message) ([]byte, error) {
	if e.json {
		return protojson.Marshal(msg)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(msg)
}

func (e encoding) headers() micro.Headers {
	return micro.Headers{"Content-Type": {e.contentType()}}
}

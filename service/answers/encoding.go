package answers

import (
	"bytes"
	"encoding/json"
	"mime"
	"strconv"
	"strings"
	"sync"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/wire"
)

// deterministic encodes as every answer, page token and plan digest is
// encoded; sized does too, with the sizes sizeCompose kept in the messages.
var (
	deterministic = proto.MarshalOptions{Deterministic: true}
	sized         = proto.MarshalOptions{Deterministic: true, UseCachedSize: true}
)

// Encoding is how one request was written, and so how it is answered.
type Encoding struct{ json bool }

// EncodingOf reads the Content-Type header (its name in any case): JSON for
// application/json, protobuf binary for anything else. Without the header, a
// body that starts with '{' is JSON, and anything else protobuf binary.
func EncodingOf(req micro.Request) Encoding {
	h := req.Headers()
	values, ok := h["Content-Type"]
	for name, v := range h {
		if !ok && strings.EqualFold(name, "Content-Type") {
			values, ok = v, true // another spelling, when the usual one is absent
		}
	}
	if ok && len(values) > 0 {
		media, _, err := mime.ParseMediaType(values[0])
		return Encoding{json: err == nil && media == wire.ContentTypeJSON}
	}
	return Encoding{json: bytes.HasPrefix(bytes.TrimSpace(req.Data()), []byte("{"))}
}

// ContentType is the Content-Type of an answer in e.
func (e Encoding) ContentType() string {
	if e.json {
		return wire.ContentTypeJSON
	}
	return wire.ContentTypeProtobuf
}

// Unmarshal decodes a request. Fields this server does not know are ignored
// in both encodings, as protobuf's own rules and connect-go do: during a
// rolling upgrade, instances of several versions serve one queue group, and
// an older one must answer what a newer client sends. A field whose meaning
// an older server must not miss is announced by the server's version
// (docs/protocol.md, "Versions"). Unknown fields are dropped, not kept, so
// that they cannot tell two requests apart for the answer cache.
func (e Encoding) Unmarshal(data []byte, msg proto.Message) *wire.Error {
	name := msg.ProtoReflect().Descriptor().FullName()
	if len(bytes.TrimSpace(data)) == 0 {
		return nil // an empty body is the default request
	}
	if e.json {
		// A request with only known fields, nearly every one, is decoded
		// once. One with unknown fields is decoded again without them, not
		// with protojson's DiscardUnknown, which would also read an enum name
		// it does not know (a newer what) as the zero value and answer
		// another question.
		err := protojson.Unmarshal(data, msg)
		if err != nil && strings.Contains(err.Error(), "unknown field") {
			proto.Reset(msg)
			var known []byte
			if known, err = knownFields(data, msg.ProtoReflect().Descriptor()); err == nil {
				err = protojson.Unmarshal(known, msg)
			}
		}
		if err != nil {
			return wire.Errorf(wire.CodeBadRequest, "the JSON request does not decode as %s: %v", name, err)
		}
		return nil
	}
	if err := (proto.UnmarshalOptions{DiscardUnknown: true}).Unmarshal(data, msg); err != nil {
		return wire.Errorf(wire.CodeBadRequest, "the request does not decode as protobuf %s (%v); send protobuf binary, or JSON with header Content-Type: %s", name, err, wire.ContentTypeJSON)
	}
	return nil
}

// Marshal encodes msg in e, deterministically.
func (e Encoding) Marshal(msg proto.Message) ([]byte, error) {
	if e.json {
		return marshalJSON(msg)
	}
	if c, ok := msg.(*provisionerv1.ComposeResponse); ok {
		return marshalCompose(c)
	}
	return deterministic.Marshal(msg)
}

// marshalJSON encodes an answer in JSON as protojson does, but for the
// elements of its repeated message fields, each of which is encoded once
// and then found again by its binary encoding (jsonElements): an answer
// built again after a change is mostly what it was (a node's plans but
// one), and protojson costs about ten times the binary encoding. The
// repeated fields come last in the object, which JSON does not order.
func marshalJSON(msg proto.Message) ([]byte, error) {
	m := msg.ProtoReflect()
	type list struct {
		fd    protoreflect.FieldDescriptor
		items []protoreflect.Value
	}
	var lists []list
	fields := m.Descriptor().Fields()
	for i := range fields.Len() {
		fd := fields.Get(i)
		if fd.IsList() && fd.Message() != nil && m.Has(fd) {
			// The elements are copied out: a list's value is a view on
			// the field, which Clear empties.
			l := list{fd: fd, items: make([]protoreflect.Value, m.Get(fd).List().Len())}
			for j := range l.items {
				l.items[j] = m.Get(fd).List().Get(j)
			}
			lists = append(lists, l)
		}
	}
	if len(lists) == 0 {
		return protojson.Marshal(msg)
	}
	for _, l := range lists {
		m.Clear(l.fd)
	}
	head, err := protojson.Marshal(msg)
	for _, l := range lists {
		restored := m.Mutable(l.fd).List()
		for _, item := range l.items {
			restored.Append(item)
		}
	}
	if err != nil {
		return nil, err
	}
	head = bytes.TrimSpace(head)
	frags := make([][][]byte, len(lists))
	size := len(head) + 1
	collected := collectedLists{marshal: deterministic}
	for i, l := range lists {
		frags[i] = make([][]byte, len(l.items))
		for j, item := range l.items {
			if frags[i][j], err = jsonElements.get(item.Message().Interface(), &collected); err != nil {
				return nil, err
			}
			size += len(frags[i][j]) + 1
		}
		size += len(l.fd.JSONName()) + 6
	}
	out := append(make([]byte, 0, size), head[:len(head)-1]...) // without its closing brace
	members := len(bytes.TrimSpace(head[1:len(head)-1])) > 0
	for i, l := range lists {
		if members {
			out = append(out, ',')
		}
		members = true
		out = strconv.AppendQuote(out, l.fd.JSONName())
		out = append(out, ':', '[')
		for j, frag := range frags[i] {
			if j > 0 {
				out = append(out, ',')
			}
			out = append(out, frag...)
		}
		out = append(out, ']')
	}
	return append(out, '}'), nil
}

// Join appends an encoded message's fields to another encoded message of
// the same type: in binary a concatenation, which protobuf reads as one
// message; in JSON the fields of both objects in one. data is never
// written (the cache's or a flight's, which others read).
func (e Encoding) Join(data, tail []byte) []byte {
	return e.JoinOwned(data[:len(data):len(data)], tail)
}

// JoinOwned is Join for data that no one else holds: in binary the tail
// goes into data's room when it has some (joinRoom), and the answer is
// not copied again; a composition of 60 x 25 is some 400 KB.
func (e Encoding) JoinOwned(data, tail []byte) []byte {
	if !e.json {
		return append(data, tail...)
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

// joinRoom returns the room to leave after an answer of size bytes for its
// tail (JoinOwned): the timings, and the revisions, one for each provider's
// bucket read (some 25 bytes each), so some 60 bytes to 2 KB. What the
// tail leaves of it stays with the answer in the cache, uncounted: at most
// 64 bytes and a 64th of the answer (Verb.Respond keeps a body the tail
// did not fit as it was built).
func joinRoom(size int) int { return min(64+size/64, 2048) }

// BodyOf returns the answer without its tail, given the answer whole that
// Join or JoinOwned made of body: in binary whole's prefix, so that who
// keeps both holds the bytes once; in JSON body itself.
func (e Encoding) BodyOf(whole, body []byte) []byte {
	if e.json {
		return body
	}
	return whole[:len(body):len(body)]
}

// Headers are an answer's headers in e.
func (e Encoding) Headers() micro.Headers {
	return micro.Headers{"Content-Type": {e.ContentType()}}
}

// knownFields returns a JSON object without the members md does not define
// (by JSON or proto name), at every depth of message fields.
func knownFields(data []byte, md protoreflect.MessageDescriptor) ([]byte, error) {
	var members map[string]json.RawMessage
	if err := json.Unmarshal(data, &members); err != nil {
		return nil, err
	}
	for key, value := range members {
		fd := md.Fields().ByJSONName(key)
		if fd == nil {
			fd = md.Fields().ByTextName(key)
		}
		switch {
		case fd == nil:
			delete(members, key)
		case fd.Message() != nil && !fd.IsList() && !fd.IsMap() && fd.Message().FullName().Parent() != "google.protobuf":
			if bytes.HasPrefix(bytes.TrimSpace(value), []byte("{")) {
				inner, err := knownFields(value, fd.Message())
				if err != nil {
					return nil, err
				}
				members[key] = inner
			}
		}
	}
	return json.Marshal(members)
}

// jsonElements keeps the JSON of answers' elements, by their type and
// binary encoding, within a byte budget.
var jsonElements = &jsonCache{limit: 16 << 20}

// jsonCache maps a message's binary encoding to its JSON. It is emptied
// whole when full: cheaper than tracking use, and what is asked again is
// encoded again at once.
type jsonCache struct {
	limit int
	mu    sync.RWMutex
	byKey map[string][]byte
	bytes int
}

// keyBuffers hold the keys looked up in jsonElements.
var keyBuffers = sync.Pool{New: func() any { return new([]byte) }}

// get returns msg's JSON, which the caller must not change. Its key is
// msg's binary encoding but for a plan's, which holds the lists its items
// share as collected encodes them, once an answer.
func (c *jsonCache) get(msg proto.Message, collected *collectedLists) ([]byte, error) {
	buf := keyBuffers.Get().(*[]byte)
	defer keyBuffers.Put(buf)
	key := append(append((*buf)[:0], msg.ProtoReflect().Descriptor().FullName()...), 0)
	var err error
	if plan, ok := msg.(*provisionerv1.ModulePlan); ok {
		key, err = collected.planKey(key, plan)
	} else {
		key, err = deterministic.MarshalAppend(key, msg)
	}
	*buf = key
	if err != nil {
		return nil, err
	}
	c.mu.RLock()
	js, ok := c.byKey[string(key)]
	c.mu.RUnlock()
	if ok {
		return js, nil
	}
	if js, err = protojson.Marshal(msg); err != nil {
		return nil, err
	}
	js = bytes.TrimSpace(js)
	c.mu.Lock()
	if c.byKey == nil || c.bytes+len(key)+len(js) > c.limit {
		c.byKey, c.bytes = map[string][]byte{}, 0
	}
	c.byKey[string(key)] = js
	c.bytes += len(key) + len(js)
	c.mu.Unlock()
	return js, nil
}

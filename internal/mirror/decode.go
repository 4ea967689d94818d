package mirror

import (
	"fmt"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// decodeValue unmarshals a bucket value into msg, saying which type failed.
// The sentence leaves out the protobuf library's own, whose wording varies
// from build to build by design: answers that report it stay the same.
func decodeValue(value []byte, msg proto.Message) error {
	if err := proto.Unmarshal(value, msg); err != nil {
		return fmt.Errorf("value of %d bytes does not decode as %s", len(value), msg.ProtoReflect().Descriptor().FullName())
	}
	return nil
}

func decodeRegistry(key string, value []byte, revision uint64) (*provisionerv1.RegistryRecord, error) {
	kind, err := keys.ParseRegistryKey(key)
	if err != nil {
		return nil, err
	}
	entry := &provisionerv1.RegistryEntry{}
	if err := decodeValue(value, entry); err != nil {
		return nil, err
	}
	if entry.GetKind() != kind {
		return nil, fmt.Errorf("key %q holds the entry of kind %q", key, entry.GetKind())
	}
	return &provisionerv1.RegistryRecord{Kind: kind, Entry: entry, Revision: revision}, nil
}

func decodeNeed(key string, value []byte, revision uint64) (*provisionerv1.NeedRecord, error) {
	k, err := keys.ParseNeedKey(key)
	if err != nil {
		return nil, err
	}
	need := &provisionerv1.Need{}
	if err := decodeValue(value, need); err != nil {
		return nil, err
	}
	return &provisionerv1.NeedRecord{Node: k.Node, Module: k.Module, Kind: k.Kind, Name: k.Name, Need: need, Revision: revision}, nil
}

func decodeApplied(key string, value []byte, revision uint64) (*provisionerv1.AppliedRecord, error) {
	k, err := keys.ParseAppliedKey(key)
	if err != nil {
		return nil, err
	}
	applied := &provisionerv1.Applied{}
	if err := decodeValue(value, applied); err != nil {
		return nil, err
	}
	return &provisionerv1.AppliedRecord{Node: k.Node, Module: k.Module, Applied: applied, Revision: revision}, nil
}

func decodeCollect(key string, value []byte, revision uint64) (*provisionerv1.CollectRecord, error) {
	k, err := keys.ParseCollectKey(key)
	if err != nil {
		return nil, err
	}
	item := &provisionerv1.CollectItem{}
	if err := decodeValue(value, item); err != nil {
		return nil, err
	}
	return &provisionerv1.CollectRecord{Node: k.Node, Collection: k.Collection, Contributor: k.Contributor, Item: item, Revision: revision}, nil
}

// needRecords returns what decodes n needs the copy holds (decodeNeed
// accepted them) without copying: the records' strings are windows on the
// keys and the values, and the records are allocated together (in reuse's
// arrays, when it is not nil). A value with a field this reader does not
// know, or any surprise, is decoded by decodeNeed instead, so a field
// added to Need is never lost.
func needRecords(n int, reuse *recordBuffers) func(key, value string, revision uint64) *provisionerv1.NeedRecord {
	if reuse == nil {
		reuse = new(recordBuffers) // arrays of this view's own
	}
	records, needs := cleared(&reuse.needRecords, n), cleared(&reuse.needs, n)
	return func(key, value string, revision uint64) *provisionerv1.NeedRecord {
		k, ok := needKeyOf(key)
		if !ok || len(records) == cap(records) {
			r, _ := decodeNeed(key, []byte(value), revision)
			return r
		}
		needs = needs[:len(needs)+1]
		need := &needs[len(needs)-1]
		if !readNeed(value, need) {
			*need = provisionerv1.Need{}
			needs = needs[:len(needs)-1]
			r, _ := decodeNeed(key, []byte(value), revision)
			return r
		}
		records = records[:len(records)+1]
		r := &records[len(records)-1]
		r.Node, r.Module, r.Kind, r.Name, r.Need, r.Revision = k.Node, k.Module, k.Kind, k.Name, need, revision
		return r
	}
}

// checkNeed says why a need is malformed, as decodeNeed would, without
// allocating for a well-formed one: most keys of a mesh are needs, all
// checked as they arrive.
func checkNeed(key, value string) error {
	if _, err := keys.ParseNeedKey(key); err != nil {
		return err
	}
	var need provisionerv1.Need
	if readNeed(value, &need) {
		return nil // what readNeed reads, proto.Unmarshal accepts
	}
	_, err := decodeNeed(key, []byte(value), 0)
	return err
}

// needKeyOf returns the parts of a need key that keys.ParseNeedKey has
// accepted, without checking its tokens again.
func needKeyOf(key string) (keys.NeedKey, bool) {
	node, rest, _ := strings.Cut(key, ".")
	module, rest, _ := strings.Cut(rest, ".")
	kind, name, ok := strings.Cut(rest, ".")
	if !ok {
		return keys.NeedKey{}, false
	}
	if strings.IndexByte(name, '=') >= 0 {
		var err error
		if name, err = keys.Unescape(name); err != nil {
			return keys.NeedKey{}, false
		}
	}
	return keys.NeedKey{Node: node, Module: module, Kind: kind, Name: name}, true
}

// needRecord decodes one need the copy holds, as needRecords does.
func needRecord(key, value string, revision uint64) *provisionerv1.NeedRecord {
	return needRecords(1, nil)(key, value, revision)
}

// readNeed reads a Need's wire bytes in place into need, which is new: its
// four strings and its bool, nothing else.
func readNeed(value string, need *provisionerv1.Need) bool {
	for len(value) > 0 {
		tag, n := varint(value)
		if n <= 0 {
			return false
		}
		value = value[n:]
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		if num == 5 && typ == protowire.VarintType {
			v, n := varint(value)
			if n <= 0 {
				return false
			}
			need.Required, value = v != 0, value[n:]
			continue
		}
		if typ != protowire.BytesType || num < 1 || num > 4 {
			return false
		}
		size, n := varint(value)
		if n <= 0 || size > uint64(len(value)-n) {
			return false
		}
		s := value[n : n+int(size)]
		if !utf8.ValidString(s) {
			return false
		}
		value = value[n+int(size):]
		switch num {
		case 1:
			need.Placeholder = s
		case 2:
			need.Provider = s
		case 3:
			need.Provision = s
		case 4:
			need.Local = s
		}
	}
	return true
}

// varint reads a varint at the start of s: its value and length, or a
// length of zero or less when s does not start with one.
func varint(s string) (uint64, int) {
	var v uint64
	for i := 0; i < len(s) && i < 10; i++ {
		b := s[i]
		v |= uint64(b&0x7f) << (7 * i)
		if b < 0x80 {
			return v, i + 1
		}
	}
	return 0, -1
}

// collectRecords returns what decodes n collection items the copy holds
// (decodeCollect accepted them), as needRecords does needs: strings are
// windows on the keys and values, records and items are allocated
// together, and only an item's attributes take a map of their own. Any
// surprise sends the value to decodeCollect.
func collectRecords(n int, reuse *recordBuffers) func(key, value string, revision uint64) *provisionerv1.CollectRecord {
	if reuse == nil {
		reuse = new(recordBuffers) // arrays of this view's own
	}
	records, items := cleared(&reuse.collectRecords, n), cleared(&reuse.items, n)
	return func(key, value string, revision uint64) *provisionerv1.CollectRecord {
		k, err := keys.ParseCollectKey(key)
		if err != nil || len(records) == cap(records) {
			r, _ := decodeCollect(key, []byte(value), revision)
			return r
		}
		items = items[:len(items)+1]
		item := &items[len(items)-1]
		if !readCollectItem(value, item) {
			*item = provisionerv1.CollectItem{}
			items = items[:len(items)-1]
			r, _ := decodeCollect(key, []byte(value), revision)
			return r
		}
		records = records[:len(records)+1]
		r := &records[len(records)-1]
		r.Node, r.Collection, r.Contributor, r.Item, r.Revision = k.Node, k.Collection, k.Contributor, item, revision
		return r
	}
}

// checkCollect says why a collection item is malformed, as decodeCollect
// would, allocating for a well-formed one only its attributes' map.
func checkCollect(key, value string) error {
	if _, err := keys.ParseCollectKey(key); err != nil {
		return err
	}
	var item provisionerv1.CollectItem
	if readCollectItem(value, &item) {
		return nil // what readCollectItem reads, proto.Unmarshal accepts
	}
	_, err := decodeCollect(key, []byte(value), 0)
	return err
}

// readCollectItem reads a CollectItem's wire bytes in place into item,
// which is new: its value, order and attributes, nothing else.
func readCollectItem(value string, item *provisionerv1.CollectItem) bool {
	for len(value) > 0 {
		tag, n := varint(value)
		if n <= 0 {
			return false
		}
		value = value[n:]
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		if num == 2 && typ == protowire.VarintType {
			v, n := varint(value)
			if n <= 0 {
				return false
			}
			item.Order, value = int32(v), value[n:]
			continue
		}
		if typ != protowire.BytesType || (num != 1 && num != 3) {
			return false
		}
		size, n := varint(value)
		if n <= 0 || size > uint64(len(value)-n) {
			return false
		}
		field := value[n : n+int(size)]
		value = value[n+int(size):]
		if num == 1 {
			if !utf8.ValidString(field) {
				return false
			}
			item.Value = field
			continue
		}
		k, v, ok := readMapEntry(field)
		if !ok {
			return false
		}
		if item.Attributes == nil {
			item.Attributes = map[string]string{}
		}
		item.Attributes[k] = v
	}
	return true
}

// readMapEntry reads a map<string, string> entry: its key and value.
func readMapEntry(entry string) (key, value string, ok bool) {
	for len(entry) > 0 {
		tag, n := varint(entry)
		if n <= 0 || protowire.Type(tag&7) != protowire.BytesType || (tag>>3 != 1 && tag>>3 != 2) {
			return "", "", false
		}
		entry = entry[n:]
		size, n := varint(entry)
		if n <= 0 || size > uint64(len(entry)-n) {
			return "", "", false
		}
		s := entry[n : n+int(size)]
		entry = entry[n+int(size):]
		if !utf8.ValidString(s) {
			return "", "", false
		}
		if tag>>3 == 1 {
			key = s
		} else {
			value = s
		}
	}
	return key, value, true
}

package mirror

import (
	"cmp"
	"slices"
	"strings"
	"unicode/utf8"

	"google.golang.org/protobuf/encoding/protowire"
)

// Builds are the builds a node's applied records name, module by module:
// all that a composition reads of them.
type Builds struct {
	modules []moduleBuilds // in module order; only those that name a build
}

type moduleBuilds struct {
	module, wanted, newest string
}

// Of returns the wanted and newest builds module's applied record names:
// empty when it names none, has no record, or its record is malformed.
func (b Builds) Of(module string) (wanted, newest string) {
	i, found := slices.BinarySearchFunc(b.modules, module, func(m moduleBuilds, module string) int { return cmp.Compare(m.module, module) })
	if !found {
		return "", ""
	}
	return b.modules[i].wanted, b.modules[i].newest
}

// BuildsOf returns the builds node's applied records name, and the applied
// copy's revision. They are read in place from the values the copy holds:
// a composition reads two fields of each record, and decoding the whole of
// every node's records (their placeholders most) was some 40% of the
// decoding the plans writer's first pass does.
func (m *Mirror) BuildsOf(node string) (Builds, uint64) {
	var b Builds
	revision := m.Applied.Values(node, func(key, value string) {
		_, module, _ := strings.Cut(key, ".")
		if wanted, newest := readBuilds(key, value); wanted != "" || newest != "" {
			b.modules = append(b.modules, moduleBuilds{module: module, wanted: wanted, newest: newest})
		}
	})
	return b, revision
}

// moduleBuilds returns the wanted and newest builds node's module's applied
// record names, read in place as BuildsOf reads them: empty when it names
// none, has no record, or its record is malformed.
func (m *Mirror) moduleBuilds(node, module string) (wanted, newest string) {
	key := node + "." + module
	if value, ok := m.Applied.valueOf(node, key); ok {
		return readBuilds(key, value)
	}
	return "", ""
}

// readBuilds reads the wanted and newest builds of an Applied's wire
// bytes, which decodeApplied accepted, skipping its other fields. A
// field it does not expect (a group, a wire type it does not skip) sends
// the value to decodeApplied, so it reads what proto.Unmarshal reads.
func readBuilds(key, value string) (wanted, newest string) {
	whole := value
	for len(value) > 0 {
		tag, n := varint(value)
		if n <= 0 {
			return decodedBuilds(key, whole)
		}
		value = value[n:]
		num, typ := protowire.Number(tag>>3), protowire.Type(tag&7)
		switch typ {
		case protowire.VarintType:
			if _, n = varint(value); n <= 0 {
				return decodedBuilds(key, whole)
			}
			value = value[n:]
		case protowire.Fixed32Type, protowire.Fixed64Type:
			size := 4
			if typ == protowire.Fixed64Type {
				size = 8
			}
			if len(value) < size {
				return decodedBuilds(key, whole)
			}
			value = value[size:]
		case protowire.BytesType:
			size, n := varint(value)
			if n <= 0 || size > uint64(len(value)-n) {
				return decodedBuilds(key, whole)
			}
			field := value[n : n+int(size)]
			value = value[n+int(size):]
			if num != 4 && num != 5 {
				continue
			}
			if !utf8.ValidString(field) {
				return decodedBuilds(key, whole)
			}
			// The last of a field repeated wins, as proto.Unmarshal reads it.
			if num == 4 {
				wanted = field
			} else {
				newest = field
			}
		default:
			return decodedBuilds(key, whole)
		}
	}
	return wanted, newest
}

// decodedBuilds reads the builds of an Applied by decoding it whole.
func decodedBuilds(key, value string) (wanted, newest string) {
	r, err := decodeApplied(key, []byte(value), 0)
	if err != nil {
		return "", ""
	}
	return r.GetApplied().GetWantedBuild(), r.GetApplied().GetNewestBuild()
}

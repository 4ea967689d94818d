package keyshape

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/novox/mesh-provisioner/keys"
)

// Placeholders lists the names a key shape or a bucket template may use.
var Placeholders = []string{"node", "module", "kind", "name", "provision", "local", "collection", "contributor", "provider"}

// Shape is a parsed key shape such as "<node>.<module>.<provision>[.<local>]":
// required tokens, then an optional tail.
type Shape struct {
	required []shapeToken
	optional []shapeToken
	all      []shapeToken // required, then optional
}

// shapeToken is a literal token or, when placeholder is set, a placeholder.
type shapeToken struct {
	literal     string
	placeholder string
}

// Parse parses a key shape: dot-separated tokens, each a literal key
// token or a placeholder <name> of Placeholders, with at most one optional
// tail "[.tokens]" at the end. The first maxParsed shapes are parsed once:
// a registry has a few, which every composition reads, and parsing them for
// each node was a tenth of the plans writer's pass over nodes of 10 x 3.
func Parse(shape string) (Shape, error) {
	if p, ok := parsedShapes.Load(shape); ok {
		p := p.(parsed)
		return p.shape, p.err
	}
	ks, err := parse(shape)
	if parsedCount.Load() < maxParsed {
		if _, loaded := parsedShapes.LoadOrStore(shape, parsed{ks, err}); !loaded {
			parsedCount.Add(1)
		}
	}
	return ks, err
}

// maxParsed bounds the shapes Parse keeps (give or take the parses that
// race past the bound).
const maxParsed = 1024

// parsed is a shape Parse kept, or why it does not parse.
type parsed struct {
	shape Shape
	err   error
}

var (
	parsedShapes sync.Map // shape -> parsed
	parsedCount  atomic.Int32
)

func parse(shape string) (Shape, error) {
	required, optional := shape, ""
	if i := strings.IndexByte(shape, '['); i >= 0 {
		if !strings.HasSuffix(shape, "]") || !strings.HasPrefix(shape[i:], "[.") {
			return Shape{}, fmt.Errorf("%w: %q: an optional tail is written [.<token>...] at the end", ErrInvalid, shape)
		}
		required, optional = shape[:i], shape[i+2:len(shape)-1]
		if strings.ContainsAny(optional, "[]") {
			return Shape{}, fmt.Errorf("%w: %q: only one optional tail, not nested", ErrInvalid, shape)
		}
	}
	var ks Shape
	var err error
	if ks.required, err = parseShapeTokens(shape, required); err != nil {
		return Shape{}, err
	}
	if optional != "" {
		if ks.optional, err = parseShapeTokens(shape, optional); err != nil {
			return Shape{}, err
		}
		if countPlaceholders(ks.optional) == 0 {
			return Shape{}, fmt.Errorf("%w: %q: an optional tail needs a placeholder that supplies it", ErrInvalid, shape)
		}
	}
	ks.all = append(slices.Clip(ks.required), ks.optional...)
	seen := map[string]bool{}
	for _, tok := range ks.all {
		if tok.placeholder == "" {
			continue
		}
		if seen[tok.placeholder] {
			return Shape{}, fmt.Errorf("%w: %q: <%s> stands twice", ErrInvalid, shape, tok.placeholder)
		}
		seen[tok.placeholder] = true
	}
	return ks, nil
}

func parseShapeTokens(shape, part string) ([]shapeToken, error) {
	var tokens []shapeToken
	for _, raw := range strings.Split(part, ".") {
		if name, ok := strings.CutPrefix(raw, "<"); ok {
			name, ok = strings.CutSuffix(name, ">")
			if !ok || !slices.Contains(Placeholders, name) {
				return nil, fmt.Errorf("%w: %q: %q is not a placeholder; use one of <%s>", ErrInvalid, shape, raw, strings.Join(Placeholders, ">, <"))
			}
			tokens = append(tokens, shapeToken{placeholder: name})
			continue
		}
		if err := keys.CheckToken(raw); err != nil {
			return nil, fmt.Errorf("%w: %q: literal token %q %w", ErrInvalid, shape, raw, err)
		}
		tokens = append(tokens, shapeToken{literal: raw})
	}
	return tokens, nil
}

// Has reports whether the shape holds the placeholder <name>.
func (k Shape) Has(name string) bool {
	for _, tok := range k.all {
		if tok.placeholder == name {
			return true
		}
	}
	return false
}

// LeadsWith reports whether the shape's first token is the placeholder
// <name>: every key it renders then begins with that value's token.
func (k Shape) LeadsWith(name string) bool {
	return len(k.required) > 0 && k.required[0].placeholder == name
}

// String returns the shape as Parse reads it.
func (k Shape) String() string {
	s := joinShape(k.required)
	if len(k.optional) > 0 {
		s += "[." + joinShape(k.optional) + "]"
	}
	return s
}

func joinShape(tokens []shapeToken) string {
	parts := make([]string, len(tokens))
	for i, tok := range tokens {
		parts[i] = tok.literal
		if tok.placeholder != "" {
			parts[i] = "<" + tok.placeholder + ">"
		}
	}
	return strings.Join(parts, ".")
}

// Values fill a key shape's placeholders, one field for each name of
// Placeholders.
type Values struct {
	Node, Module, Kind, Name, Provision, Local, Collection, Contributor, Provider string
}

// get returns the value of a placeholder.
func (v *Values) get(placeholder string) string {
	switch placeholder {
	case "node":
		return v.Node
	case "module":
		return v.Module
	case "kind":
		return v.Kind
	case "name":
		return v.Name
	case "provision":
		return v.Provision
	case "local":
		return v.Local
	case "collection":
		return v.Collection
	case "contributor":
		return v.Contributor
	case "provider":
		return v.Provider
	}
	return ""
}

// Render returns the concrete key for the values given. Every required
// placeholder needs a value; the optional tail is included only when all of
// its placeholders have one. A <collection> value is the readable name and
// is escaped; every other value must be a key token.
func (k Shape) Render(values Values) (string, error) {
	var buf [128]byte
	b, err := k.render(buf[:0], &values, false)
	return string(b), err
}

// Filter is Render for a set of keys: a required placeholder without a value
// stands as the wildcard "*", so "<node>.<collection>.<contributor>" with no
// contributor renders "ace.shell=3Azsh=3Anormal.*".
func (k Shape) Filter(values Values) (string, error) {
	var buf [128]byte
	b, err := k.render(buf[:0], &values, true)
	return string(b), err
}

// AppendRender appends the key Render returns to b: a caller that reads
// the key and drops it (a digest) makes no string of it.
func (k Shape) AppendRender(b []byte, values Values) ([]byte, error) {
	return k.render(b, &values, false)
}

// AppendFilter appends the key Filter returns to b.
func (k Shape) AppendFilter(b []byte, values Values) ([]byte, error) {
	return k.render(b, &values, true)
}

// render appends the key to b, which it returns unchanged with an error.
func (k Shape) render(b []byte, values *Values, wildcards bool) ([]byte, error) {
	tail := 0
	for _, tok := range k.optional {
		if tok.placeholder != "" && values.get(tok.placeholder) != "" {
			tail++
		}
	}
	tokens := k.required
	switch tail {
	case 0:
	case countPlaceholders(k.optional):
		tokens = k.all
	default:
		return b, fmt.Errorf("%w: %s: the optional tail needs all of its values or none", ErrCannotRender, k)
	}
	start := len(b)
	for i, tok := range tokens {
		if i > 0 {
			b = append(b, '.')
		}
		if tok.placeholder == "" {
			b = append(b, tok.literal...)
			continue
		}
		v := values.get(tok.placeholder)
		switch {
		case v == "" && wildcards:
			b = append(b, '*')
		case v == "":
			return b[:start], fmt.Errorf("%w: %s: no value for <%s>", ErrCannotRender, k, tok.placeholder)
		case tok.placeholder == "collection":
			b = keys.AppendEscaped(b, v)
		default:
			if err := keys.CheckToken(v); err != nil {
				return b[:start], fmt.Errorf("%w: %s: <%s> %q %w", ErrCannotRender, k, tok.placeholder, v, err)
			}
			b = append(b, v...)
		}
	}
	return b, nil
}

func countPlaceholders(tokens []shapeToken) int {
	n := 0
	for _, tok := range tokens {
		if tok.placeholder != "" {
			n++
		}
	}
	return n
}

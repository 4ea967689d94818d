package keys

import (
	"fmt"
	"strings"
)

// NeedKey is a key of NeedsBucket: <node>.<module>.<kind>.<name>.
// Name is the placeholder's readable name ("zsh:normal" of
// ${shell:zsh:normal}); the key holds it escaped.
type NeedKey struct {
	Node, Module, Kind, Name string
}

// AppliedKey is a key of AppliedBucket: <node>.<module>.
type AppliedKey struct {
	Node, Module string
}

// ManifestKey is a key of ManifestsBucket: <node>.<provider>.
type ManifestKey struct {
	Node, Provider string
}

// CollectKey is a key of CollectBucket: <node>.<collection>.<contributor>.
// Collection is the readable name; the key holds it escaped.
type CollectKey struct {
	Node, Collection, Contributor string
}

// part is one named part of a key, in key order.
type part struct{ name, value string }

// format joins parts into a key after checking each is a token.
func format(parts ...part) (string, error) {
	for _, p := range parts {
		if err := CheckToken(p.value); err != nil {
			return "", fmt.Errorf("%w: %s %q %w", ErrInvalidPart, p.name, Echo(p.value), err)
		}
	}
	var b strings.Builder
	for i, p := range parts {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(p.value)
	}
	return b.String(), nil
}

// split cuts key into exactly len(names) tokens, each a valid token. The
// tokens are windows on key, in an array that stays on the caller's stack:
// the watched copy parses every key it holds.
func split(key string, names ...string) ([4]string, error) {
	var tokens [4]string
	n, rest := 0, key
	for {
		tok, after, more := strings.Cut(rest, ".")
		if n < len(tokens) {
			tokens[n] = tok
		}
		n++
		if !more {
			break
		}
		rest = after
	}
	if n != len(names) {
		return tokens, fmt.Errorf("%w: %q has %d tokens, want %d (<%s>)", ErrMalformedKey, Echo(key), n, len(names), strings.Join(names, ">.<"))
	}
	for i, tok := range tokens[:n] {
		if err := CheckToken(tok); err != nil {
			return tokens, fmt.Errorf("%w: %q: token %d (<%s>) %w", ErrMalformedKey, Echo(key), i+1, names[i], err)
		}
	}
	return tokens, nil
}

// Key returns the key of the need, with the name escaped, or an error
// wrapping ErrInvalidPart.
func (k NeedKey) Key() (string, error) {
	if k.Name == "" {
		return "", fmt.Errorf("%w: name is empty", ErrInvalidPart)
	}
	return format(part{"node", k.Node}, part{"module", k.Module}, part{"kind", k.Kind}, part{"name", Escape(k.Name)})
}

// ParseNeedKey returns the parts of a key of NeedsBucket, the name unescaped.
func ParseNeedKey(key string) (NeedKey, error) {
	t, err := split(key, "node", "module", "kind", "name")
	if err != nil {
		return NeedKey{}, err
	}
	name, err := Unescape(t[3])
	if err != nil {
		return NeedKey{}, fmt.Errorf("%w: %q: token 4 (<name>) %w", ErrMalformedKey, Echo(key), err)
	}
	return NeedKey{Node: t[0], Module: t[1], Kind: t[2], Name: name}, nil
}

// Key returns the key of the applied record, or an error wrapping
// ErrInvalidPart.
func (k AppliedKey) Key() (string, error) {
	return format(part{"node", k.Node}, part{"module", k.Module})
}

// ParseAppliedKey returns the parts of a key of AppliedBucket.
func ParseAppliedKey(key string) (AppliedKey, error) {
	t, err := split(key, "node", "module")
	if err != nil {
		return AppliedKey{}, err
	}
	return AppliedKey{Node: t[0], Module: t[1]}, nil
}

// Key returns the key of the manifest, or an error wrapping ErrInvalidPart.
func (k ManifestKey) Key() (string, error) {
	return format(part{"node", k.Node}, part{"provider", k.Provider})
}

// ParseManifestKey returns the parts of a key of ManifestsBucket.
func ParseManifestKey(key string) (ManifestKey, error) {
	t, err := split(key, "node", "provider")
	if err != nil {
		return ManifestKey{}, err
	}
	return ManifestKey{Node: t[0], Provider: t[1]}, nil
}

// Key returns the key of the collection item, with the collection escaped, or
// an error wrapping ErrInvalidPart.
func (k CollectKey) Key() (string, error) {
	if k.Collection == "" {
		return "", fmt.Errorf("%w: collection is empty", ErrInvalidPart)
	}
	return format(part{"node", k.Node}, part{"collection", Escape(k.Collection)}, part{"contributor", k.Contributor})
}

// ParseCollectKey returns the parts of a key of CollectBucket, the collection
// unescaped.
func ParseCollectKey(key string) (CollectKey, error) {
	t, err := split(key, "node", "collection", "contributor")
	if err != nil {
		return CollectKey{}, err
	}
	collection, err := Unescape(t[1])
	if err != nil {
		return CollectKey{}, fmt.Errorf("%w: %q: token 2 (<collection>) %w", ErrMalformedKey, Echo(key), err)
	}
	return CollectKey{Node: t[0], Collection: collection, Contributor: t[2]}, nil
}

// RegistryKey returns the key of a kind in RegistryBucket, or an error wrapping
// ErrInvalidPart.
func RegistryKey(kind string) (string, error) {
	return format(part{"kind", kind})
}

// ParseRegistryKey returns the kind a key of RegistryBucket names.
func ParseRegistryKey(key string) (string, error) {
	t, err := split(key, "kind")
	if err != nil {
		return "", err
	}
	return t[0], nil
}

// NodeFilter returns the key filter that matches every key of node in a state
// bucket: "<node>.>". The node is a token of at most MaxNameLen bytes.
func NodeFilter(node string) (string, error) {
	if err := CheckLength("node", node); err != nil {
		return "", fmt.Errorf("%w: %w", ErrInvalidPart, err)
	}
	if err := CheckToken(node); err != nil {
		return "", fmt.Errorf("%w: node %q %w", ErrInvalidPart, Echo(node), err)
	}
	return node + ".>", nil
}

// CheckBoundKey checks a key of a provider's bucket <provider>_bound:
// <node>.<module>.<provision>[.<local>], each part a token.
func CheckBoundKey(key string) error {
	parts := strings.Split(key, ".")
	if len(parts) < 3 || len(parts) > 4 {
		return fmt.Errorf("%w: %q has %d tokens; a provider's key is <node>.<module>.<provision>[.<local>]", ErrMalformedKey, Echo(key), len(parts))
	}
	for i, p := range parts {
		if err := CheckToken(p); err != nil {
			return fmt.Errorf("%w: %s %q %w", ErrMalformedKey, [...]string{"node", "module", "provision", "local"}[i], Echo(p), err)
		}
	}
	return nil
}

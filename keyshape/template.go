package keyshape

import "strings"

// ProviderOwner is the owner of an entry that each provider answers: it
// stands for the provider module a need names.
const ProviderOwner = "<provider>"

// CollectionOf returns the collection a placeholder of kind and name reads,
// from an entry's collection template. <kind> is filled first: a kind is a
// token and holds no placeholder, while a name may look like one.
func CollectionOf(template, kind, name string) string {
	if template == "<name>" {
		return name
	}
	return string(AppendCollection(nil, template, kind, name))
}

// AppendCollection appends CollectionOf(template, kind, name) to b.
func AppendCollection(b []byte, template, kind, name string) []byte {
	switch template { // the registry's two templates, without a search
	case "<name>":
		return append(b, name...)
	case "<kind>:<name>":
		b = append(b, kind...)
		b = append(b, ':')
		return append(b, name...)
	}
	return append(b, strings.ReplaceAll(strings.ReplaceAll(template, "<kind>", kind), "<name>", name)...)
}

package permissions

import (
	"encoding/json"
	"strconv"
	"strings"
)

// Config returns the permissions as a nats-server configuration block, to
// stand as the value of a user's "permissions" key:
//
//	authorization { users = [ { user: ace, password: ..., permissions: <Config()> } ] }
func (p Permissions) Config() string {
	var b strings.Builder
	b.WriteString("{\n")
	writeRule(&b, "publish", p.Publish)
	writeRule(&b, "subscribe", p.Subscribe)
	b.WriteString("}")
	return b.String()
}

func writeRule(b *strings.Builder, name string, r Rule) {
	b.WriteString("  " + name + ": {\n")
	writeList(b, "allow", r.Allow)
	writeList(b, "deny", r.Deny)
	b.WriteString("  }\n")
}

func writeList(b *strings.Builder, name string, subjects []string) {
	if len(subjects) == 0 {
		return
	}
	b.WriteString("    " + name + ": [\n")
	for _, s := range subjects {
		// Quoted: subjects start with $ and hold '>', which the
		// configuration format would otherwise read as variables.
		b.WriteString("      " + strconv.Quote(s) + "\n")
	}
	b.WriteString("    ]\n")
}

// JSON returns the permissions as indented JSON, which nats-server also
// reads as configuration.
func (p Permissions) JSON() string {
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false) // subjects hold '>', which stays readable
	enc.SetIndent("", "  ")
	_ = enc.Encode(p) // a struct of strings always encodes
	return strings.TrimSuffix(b.String(), "\n")
}

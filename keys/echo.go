package keys

import "fmt"

// MaxNameLen is the most bytes a name a request gives may take (a node,
// module, kind, provider, collection, contributor, or a whole key): the
// service refuses a longer one. It is wire.MaxNameLen, which this package
// does not import; NodeFilter and CheckLength hold names to it.
const MaxNameLen = 256

// MaxEchoed is the most characters of a name an error sentence echoes.
const MaxEchoed = 64

// Echo returns name as an error sentence echoes it: whole when it has at
// most MaxEchoed characters, else its first MaxEchoed characters and "…", so
// that a refusal stays a sentence whatever a request names. Every sentence
// that echoes a name (a node, module, kind, name, provider, collection,
// contributor or key) echoes what Echo returns, quoted or not.
func Echo(name string) string {
	n := 0
	for i := range name {
		if n == MaxEchoed {
			return name[:i] + "…"
		}
		n++
	}
	return name
}

// CheckLength returns nil if value takes at most MaxNameLen bytes, else
// the error that says so: label names the value ("module", "--node"), and
// the value is echoed cut (Echo).
func CheckLength(label, value string) error {
	if len(value) <= MaxNameLen {
		return nil
	}
	return fmt.Errorf("%s %q is %d bytes, more than the %d a name may take: shorten it", label, Echo(value), len(value), MaxNameLen)
}

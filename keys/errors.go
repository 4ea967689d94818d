package keys

import "errors"

var (
	// ErrMalformedKey is wrapped by every error of a parser: the key is out
	// of its bucket's shape.
	ErrMalformedKey = errors.New("malformed key")

	// ErrInvalidPart is wrapped by every error of a formatter: a part cannot
	// be written into a key.
	ErrInvalidPart = errors.New("invalid key part")
)

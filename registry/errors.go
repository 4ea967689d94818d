package registry

import "errors"

var (
	// ErrInvalidTable is wrapped by every error of Validate.
	ErrInvalidTable = errors.New("invalid registry table")

	// ErrInvalidKeyShape is wrapped by every error of ParseKeyShape.
	ErrInvalidKeyShape = errors.New("invalid key shape")

	// ErrCannotRender is wrapped by every error of KeyShape.Render: the
	// values given cannot fill the shape.
	ErrCannotRender = errors.New("cannot render key")
)

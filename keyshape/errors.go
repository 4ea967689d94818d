package keyshape

import "errors"

var (
	// ErrInvalid is wrapped by every error of Parse.
	ErrInvalid = errors.New("invalid key shape")

	// ErrCannotRender is wrapped by every error of Shape.Render: the values
	// given cannot fill the shape.
	ErrCannotRender = errors.New("cannot render key")
)

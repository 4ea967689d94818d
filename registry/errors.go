package registry

import "errors"

// ErrInvalidTable is wrapped by every error of Validate.
var ErrInvalidTable = errors.New("invalid registry table")

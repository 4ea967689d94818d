package wire

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/nats-io/nats.go"
)

// Code is the numeric code of an error answer, sent in the
// Nats-Service-Error-Code header.
type Code int

// The codes a verb answers with.
const (
	// CodeUnknown is the code of an error that is not an [*Error].
	CodeUnknown Code = 0
	// CodeBadRequest: the request cannot be read or asks for something the
	// verb does not answer. The sentence says what to fix.
	CodeBadRequest Code = 400
	// CodeForbidden: the request asks, on an addressed subject
	// (mesh-provisioner.compose.<node>, ...), for what is not that
	// subject's: another node's records or plan, another provider's
	// provisions. Ask on the subject of whose it is, as that identity.
	CodeForbidden Code = 403
	// CodeTooLarge: a write is over a limit: its value is larger than the
	// bucket's largest value, or it would take its node over the budget
	// the server keeps of it. The sentence names the limit.
	CodeTooLarge Code = 413
	// CodeInternal: the server failed to answer a valid request.
	CodeInternal Code = 500
	// CodeUnavailable: the server cannot answer now (its copy is loading or
	// behind the revision asked for, it is stopping, or it is overloaded);
	// ask again shortly.
	CodeUnavailable Code = 503
)

// String returns the code as it travels: "400".
func (c Code) String() string { return strconv.Itoa(int(c)) }

// Error is an answer a verb refused: a code and a sentence that says what to
// fix. The server sends it; clients return it.
type Error struct {
	code     Code
	sentence string
}

// NewError returns an error with a code and a sentence.
func NewError(code Code, sentence string) *Error { return &Error{code: code, sentence: sentence} }

// Errorf returns an error with a code and a formatted sentence.
func Errorf(code Code, format string, args ...any) *Error {
	return &Error{code: code, sentence: fmt.Sprintf(format, args...)}
}

// Code returns the error's code.
func (e *Error) Code() Code { return e.code }

// Sentence returns what the server said, without the code.
func (e *Error) Sentence() string { return e.sentence }

func (e *Error) Error() string { return "mesh-provisioner: " + e.code.String() + ": " + e.sentence }

// CodeOf returns the code of the first [*Error] in err's chain, or
// CodeUnknown.
func CodeOf(err error) Code {
	if e, ok := errors.AsType[*Error](err); ok {
		return e.code
	}
	return CodeUnknown
}

// ErrorOf returns the [*Error] a reply carries in its Nats-Service-Error
// headers, or nil for an answer.
func ErrorOf(reply *nats.Msg) error {
	sentence := reply.Header.Get(ErrorHeader)
	codeText := reply.Header.Get(ErrorCodeHeader)
	if sentence == "" && codeText == "" {
		return nil
	}
	code, err := strconv.Atoi(codeText)
	if err != nil {
		return fmt.Errorf("%w (the error code %q is not a number)", NewError(CodeUnknown, sentence), codeText)
	}
	return NewError(Code(code), sentence)
}

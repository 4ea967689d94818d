package service

import (
	"errors"
	"strconv"
)

// Error codes the service sends in the Nats-Service-Error-Code header.
const (
	// CodeBadRequest: the request cannot be read or asks for something the
	// verb does not answer. The sentence says what to fix.
	CodeBadRequest = 400
	// CodeNotReady: the server's copy of the buckets is still loading.
	CodeNotReady = 503
	// CodeInternal: the server failed to answer a valid request.
	CodeInternal = 500
)

// ErrBucketMissing is returned by Start when a provisioning bucket does not
// exist; create the buckets with EnsureBuckets first.
var ErrBucketMissing = errors.New("provisioning bucket missing")

// codedError is an answer the service refuses with a code and a sentence.
type codedError struct {
	code     int
	sentence string
}

func (e *codedError) Error() string { return strconv.Itoa(e.code) + " " + e.sentence }

func badRequest(sentence string) *codedError { return &codedError{CodeBadRequest, sentence} }

package service

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
)

// revisionWait is a revision a request asks one bucket's copy to reach
// before it is answered.
type revisionWait struct {
	copy     watched
	revision uint64
}

// answerFunc builds the answer of a checked request; waited is how long it
// waited for revisions.
type answerFunc func(waited time.Duration) proto.Message

// handle reads and checks a request on the micro callback, so that micro
// counts every refusal, then answers it on a worker: the callback is free for
// the next request while a large answer is built and encoded. A request that
// asks for revisions the copy has not reached waits for them first, without
// holding a worker.
func (s *Service) handle(req micro.Request, count *counters, in proto.Message, check func() *codedError, waits func() []revisionWait, answer answerFunc) {
	enc := encodingOf(req)
	if cerr := enc.unmarshal(req.Data(), in); cerr != nil {
		s.refuse(req, enc, cerr)
		return
	}
	if cerr := check(); cerr != nil {
		s.refuse(req, enc, cerr)
		return
	}
	if loading := s.mirror.loading(); len(loading) > 0 {
		s.refuse(req, enc, &codedError{CodeNotReady, fmt.Sprintf("the server is still loading its copy of %s; ask again shortly", strings.Join(loading, ", "))})
		return
	}
	var pending []revisionWait
	for _, w := range waits() {
		if w.revision > 0 && w.copy.at() < w.revision {
			pending = append(pending, w)
		}
	}
	if !s.admit() {
		s.refuse(req, enc, &codedError{CodeNotReady, "the server is stopping; ask another instance or again shortly"})
		return
	}
	if len(pending) == 0 {
		s.slots <- struct{}{} // backpressure: the callback waits for a worker
		go func() {
			defer func() { <-s.slots; s.answers.Done() }()
			s.send(req, enc, count, answer(0), nil)
		}()
		return
	}
	select {
	case s.waiting <- struct{}{}:
	default:
		s.answers.Done()
		s.refuse(req, enc, &codedError{CodeNotReady, fmt.Sprintf("%d requests already wait for revisions the server's copy has not reached; ask again shortly", cap(s.waiting))})
		return
	}
	go func() {
		defer func() { <-s.waiting; s.answers.Done() }()
		start := time.Now()
		if cerr := s.waitRevisions(pending); cerr != nil {
			s.send(req, enc, count, nil, cerr)
			return
		}
		waited := time.Since(start)
		s.slots <- struct{}{}
		defer func() { <-s.slots }()
		s.send(req, enc, count, answer(waited), nil)
	}()
}

// waitRevisions waits, at most RevisionWait, until every copy has reached
// the revision asked of it.
func (s *Service) waitRevisions(waits []revisionWait) *codedError {
	ctx, cancel := context.WithTimeout(s.stopping, s.revisionWait)
	defer cancel()
	for _, w := range waits {
		if !w.copy.waitFor(ctx, w.revision) {
			if s.stopping.Err() != nil {
				return &codedError{CodeNotReady, "the server is stopping; ask another instance or again shortly"}
			}
			return &codedError{CodeNotReady, fmt.Sprintf("the server's copy of %s is at revision %d, behind the %d asked for, after waiting %s; ask again shortly",
				w.copy.name(), w.copy.at(), w.revision, s.revisionWait)}
		}
	}
	return nil
}

// admit counts a request in before it is answered off the callback, unless
// Stop has begun: Stop then waits for every admitted request.
func (s *Service) admit() bool {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return false
	}
	s.answers.Add(1)
	return true
}

// send sends a worker's answer, or its refusal, to the request's reply
// subject on the service's connection. Workers do not call req.Respond or
// req.Error: micro reads what those record when the callback returns, which
// for a worker is before they run; send's own counters stand in for it.
func (s *Service) send(req micro.Request, enc encoding, count *counters, answer proto.Message, cerr *codedError) {
	msg := &nats.Msg{Subject: req.Reply(), Header: nats.Header{"Content-Type": {enc.contentType()}}}
	if cerr == nil {
		data, err := enc.marshal(answer)
		switch {
		case err != nil:
			s.logger.Error("encoding an answer failed", "err", err)
			cerr = &codedError{CodeInternal, "the server could not encode its answer; see its log"}
		case int64(len(data)+headerLen(msg.Header)) > s.conn.MaxPayload():
			cerr = &codedError{CodeInternal, fmt.Sprintf("the answer is %d bytes, more than the %d the NATS server carries (max_payload); narrow the request, by node or module", len(data), s.conn.MaxPayload())}
		default:
			msg.Data = data
		}
	}
	if cerr != nil {
		msg.Header.Set(micro.ErrorHeader, cerr.sentence)
		msg.Header.Set(micro.ErrorCodeHeader, strconv.Itoa(cerr.code))
	}
	err := s.conn.PublishMsg(msg)
	switch {
	case err != nil:
		s.logger.Warn("sending an answer failed", "err", err, "bytes", len(msg.Data))
		count.answerErrors.Add(1)
	case cerr != nil:
		count.answerErrors.Add(1)
	default:
		count.answered.Add(1)
	}
}

// headerLen is the size of a message's headers on the wire: what counts
// toward max_payload beside the body.
func headerLen(h nats.Header) int {
	n := len("NATS/1.0\r\n") + len("\r\n")
	for k, values := range h {
		for _, v := range values {
			n += len(k) + len(": ") + len(v) + len("\r\n")
		}
	}
	return n
}

func (s *Service) refuse(req micro.Request, enc encoding, cerr *codedError) {
	s.logger.Debug("request refused", "code", cerr.code, "reason", cerr.sentence)
	if err := req.Error(strconv.Itoa(cerr.code), cerr.sentence, nil, micro.WithHeaders(enc.headers())); err != nil {
		s.logger.Warn("sending an error failed", "err", err)
	}
}

package service

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// endpoint is one read verb as micro serves it: the verb (the answers
// room's), and, on an addressed endpoint, whom its subject names and what
// confines the request to them (the admission room's). It is the one
// adapter between micro and the verbs, in the shape of connect-go's
// NewUnaryHandler.
type endpoint[Req, Res proto.Message] struct {
	answers.Verb[Req, Res]
	// owner, if set, makes the endpoint addressed: it answers on
	// "<subject>.*", whose last token names the node or provider the request
	// is for, and confine refuses (403) a request that asks beyond it. The
	// name is nats-server's to confine: an identity's permissions grant its
	// own subject only.
	owner   wire.Role
	confine func(name string, req Req) *wire.Error
}

// addressed returns ep as its addressed endpoint for owner: the same verb on
// "<subject>.<name>", each request confined to name.
func (ep endpoint[Req, Res]) addressed(name string, owner wire.Role, confine func(string, Req) *wire.Error) endpoint[Req, Res] {
	ep.Name, ep.owner, ep.confine = name, owner, confine
	return ep
}

// addresseeOf returns whom r's subject names on an addressed endpoint; on
// an unscoped one, nobody (the zero admission.Asker).
func (ep endpoint[Req, Res]) addresseeOf(r micro.Request) admission.Asker {
	if ep.owner == "" {
		return admission.Asker{}
	}
	return admission.Asker{Role: ep.owner, Name: r.Subject()[strings.LastIndexByte(r.Subject(), '.')+1:]}
}

// subjectOf returns the subject the endpoint subscribes to.
func (ep endpoint[Req, Res]) subjectOf() string {
	if ep.owner != "" {
		return ep.Subject + ".*"
	}
	return ep.Subject
}

// registrar is what Start needs of an endpoint, whatever its types.
type registrar interface {
	// names returns the endpoint's name and subject, which its counters
	// are made with before micro can ask for them.
	names() (name, subject string)
	// namesAsker reports whether the endpoint's subject names its asker:
	// in a partitioned mesh, each partition's instance has it.
	namesAsker() bool
	// register adds the endpoint to svc: on its subject, or on partition
	// pt's (when not nil).
	register(s *Service, svc micro.Service, pt *partition) error
	// relays and registerRelay: whether an instance that serves some
	// partitions hands the endpoint's requests about other partitions
	// on, and the endpoint that takes them for partition p (hold.go).
	relays() bool
	registerRelay(s *Service, svc micro.Service, p int) error
}

// addEndpoint adds an endpoint to svc, on subject, or on partition pt's
// (when not nil): its door, if owner is set, drops past rate a second of
// each asker (the token after prefix), and prepare reads and checks each
// request it lets in.
func (s *Service) addEndpoint(svc micro.Service, pt *partition, name, prefix, subject string, owner wire.Role, rate int, prepare func(micro.Request) func(bool), request, response protoreflect.FullName) error {
	count := s.counters[name] // made by Start before the stats handler was live
	if pt != nil {
		subject += pt.token
	}
	err := svc.AddEndpoint(name, s.handlerOf(name, prefix, owner, rate, count, pt, prepare),
		micro.WithEndpointSubject(subject),
		pendingLimits(owner),
		micro.WithEndpointMetadata(map[string]string{
			"request":       string(request),
			"response":      string(response),
			"content_types": wire.ContentTypeProtobuf + ", " + wire.ContentTypeJSON,
		}),
	)
	if err != nil {
		return fmt.Errorf("add endpoint %s: %w", name, err)
	}
	return nil
}

func (ep endpoint[Req, Res]) names() (name, subject string) { return ep.Name, ep.subjectOf() }

// endpoints lists the verbs the service answers, the write verbs last.
func (s *Service) endpoints() []registrar {
	provisioning := endpoint[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse]{Verb: s.answers.Provisioning()}
	compose := endpoint[*provisionerv1.ComposeRequest, *provisionerv1.ComposeResponse]{Verb: s.answers.Compose()}
	provisions := endpoint[*provisionerv1.ProvisionsRequest, *provisionerv1.ProvisionsResponse]{Verb: s.answers.Provisions()}
	return append([]registrar{
		provisioning, compose,
		provisioning.addressed(wire.ProvisioningNodeEndpoint, wire.RoleNode, func(node string, in *provisionerv1.ProvisioningRequest) *wire.Error {
			return admission.ConfineProvisioning(node, answers.WhatOf(in), in)
		}),
		compose.addressed(wire.ComposeNodeEndpoint, wire.RoleNode, admission.ConfineCompose),
		provisions.addressed(wire.ProvisionsEndpoint, wire.RoleProvider, admission.ConfineProvisions),
	}, s.writeVerbs()...)
}

func (ep endpoint[Req, Res]) namesAsker() bool { return ep.owner != "" }

func (ep endpoint[Req, Res]) register(s *Service, svc micro.Service, pt *partition) error {
	var res Res // a typed nil: its descriptor is all that is read
	count := s.counters[ep.Name]
	prepare := func(r micro.Request) func(bool) { return ep.prepare(s, count, r) }
	return s.addEndpoint(svc, pt, ep.Name, ep.Subject, ep.subjectOf(), ep.owner, s.maxRatePerAsker, prepare,
		ep.NewRequest().ProtoReflect().Descriptor().FullName(), res.ProtoReflect().Descriptor().FullName())
}

// prepare reads and checks a request on the micro callback, where micro
// counts each refusal (refuse, onCallback), and returns what answers it
// once its turn comes, or nil when it was refused or gets no answer at all.
// A request whose reply subject is not an inbox gets no answer: the
// callback is free for the next request while a large answer is built and
// encoded. A request that asks for revisions the copy has not reached
// waits for them first, without holding a worker.
func (ep endpoint[Req, Res]) prepare(s *Service, count *counters, r micro.Request) (answer func(onCallback bool)) {
	arrived := time.Now()
	// First, before anything can answer: every path below (refusals, 503s,
	// pages, reused answers) publishes to r.Reply().
	who := ep.addresseeOf(r)
	if !s.answersTo(r, who) {
		s.refuseReply(r, count)
		return nil
	}
	relayed := isRelayed(r) // before observed wraps it
	r = s.observed(r, ep.Name, arrived)
	enc := answers.EncodingOf(r)
	in := ep.NewRequest()
	if werr := enc.Unmarshal(r.Data(), in); werr != nil {
		s.refuse(r, enc, count, werr, true)
		return nil
	}
	if werr := ep.Check(in); werr != nil {
		s.refuse(r, enc, count, werr, true)
		return nil
	}
	if ep.owner != "" {
		if werr := ep.confine(who.Name, in); werr != nil {
			s.refuse(r, enc, count, werr, true)
			return nil
		}
	}
	return func(onCallback bool) { ep.reply(s, count, r, who, in, enc, arrived, onCallback, relayed) }
}

// reply answers a checked request: handed on when it reads a partition
// this instance does not serve (relay), unless another instance handed it
// on; refused at once when the queue or the asker's places are full or
// the copy is loading (but for an early answer); else answered from the
// whole copy (answerWhole).
func (ep endpoint[Req, Res]) reply(s *Service, count *counters, r micro.Request, who admission.Asker, in Req, enc answers.Encoding, arrived time.Time, onCallback, relayed bool) {
	if ep.PartitionOf != nil {
		// About nodes of a partition this instance does not serve: its
		// holder answers. One handed on as this instance let p go is
		// answered here: its copy holds p's nodes a while longer (Hold).
		if p, ok := ep.PartitionOf(in); ok && !s.HoldsPartition(p) && (!relayed || !s.copyHolds(p)) {
			switch {
			case p < 0 || p >= len(s.partitions):
				// Only a page token names a partition: one made by hand.
				s.refuse(r, enc, count, wire.Errorf(wire.CodeBadRequest, "page_token names partition %d, which this mesh of %d partitions does not have; send the next_page_token of the previous page as it came, or leave page_token out to start again", p, len(s.partitions)), onCallback)
				return
			case relayed:
				s.refuse(r, enc, count, notHeldHere(p), onCallback)
				return
			}
			s.relay(r, who, p, enc, count, onCallback)
			return
		}
	}
	if len(s.queue) == cap(s.queue) {
		count.queueFull.Add(1)
		s.refuse(r, enc, count, s.overloaded(), onCallback)
		return
	}
	if s.places.Full(who) {
		count.askerFull.Add(1)
		s.refuse(r, enc, count, s.places.AskerFull(who), onCallback)
		return
	}
	if !s.mirror.Ready() {
		if ep.Early != nil {
			ep.answerEarly(s, r, in, enc, count, arrived, onCallback)
			return
		}
		s.refuse(r, enc, count, s.answers.StillLoading(), onCallback)
		return
	}
	if werr := ep.answerWhole(s, r, in, enc, count, arrived, true); werr != nil {
		s.refuse(r, enc, count, werr, onCallback)
	}
}

// answerWhole answers a checked request from the whole copy, once it
// reaches the revisions the request asks for (answerReached), or returns
// the refusal for its caller to send: on the micro callback with refuse,
// so that micro counts it, elsewhere with send. join says it may wait for
// the answer of an identical request being built (flights); a request that
// waited for one and finds no answer kept is answered as any other,
// without joining again.
func (ep endpoint[Req, Res]) answerWhole(s *Service, r micro.Request, in Req, enc answers.Encoding, count *counters, arrived time.Time, join bool) *wire.Error {
	if ep.Unavailable != nil {
		if werr := ep.Unavailable(in); werr != nil {
			return werr
		}
	}
	pending := ep.Pending(in)
	if len(pending) == 0 {
		return ep.answerReached(s, r, in, enc, count, arrived, 0, join)
	}
	// Counted in while it waits, so that Stop waits for it too.
	t, werr := s.enterWaiting(ep.addresseeOf(r), count, s.waiting, func() *wire.Error {
		return wire.Errorf(wire.CodeUnavailable, "%d requests already wait for revisions the server's copy has not reached; ask again shortly", cap(s.waiting))
	})
	if werr != nil {
		return werr
	}
	go func() {
		defer t.done()
		start := time.Now()
		werr := s.answers.WaitRevisions(pending)
		// Its place is the queue's from here (answerReached), not a
		// second one for the same request.
		t.givePlace()
		if werr == nil {
			// Reached, it is a request that came now: answered from the
			// cache or a flight, as are the many that wait for one
			// provider's bucket read for the first time, not each on a
			// worker of its own.
			werr = ep.answerReached(s, r, in, enc, count, time.Now(), time.Since(start), join)
		}
		if werr != nil {
			s.send(r, enc, count, nil, werr)
		}
	}()
	return nil
}

// answerReached answers a checked request whose revisions the copy has
// reached, waited for for waited, or returns the refusal for its caller to
// send (answerWhole): an answer kept is sent from the caller's goroutine,
// with no worker to wait for; one being built for an identical request is
// waited for (flights) if join says so; any other is built on a worker,
// its time in the queue measured from queued. A full queue is refused at
// once.
func (ep endpoint[Req, Res]) answerReached(s *Service, r micro.Request, in Req, enc answers.Encoding, count *counters, queued time.Time, waited time.Duration, join bool) *wire.Error {
	data, key, st, ok := ep.Lookup(s.answers, in, enc, waited)
	if ok {
		s.send(r, enc, count, data, nil)
		return nil
	}
	land := func([]byte) {}
	if join && s.flights != nil {
		joined, landed := s.flights.Join(key, st, func(body []byte) { ep.afterFlight(s, r, in, enc, count, queued, waited, body) })
		if joined {
			return nil
		}
		if landed != nil {
			land = landed
		}
	}
	// From here the request is counted in until its answer is sent:
	// release says so, once, wherever that happens.
	release := s.admit()
	if release == nil {
		land(nil)
		return answers.ErrStopping
	}
	give, werr := s.hold(ep.addresseeOf(r), count)
	if werr != nil {
		release()
		land(nil)
		return werr
	}
	run := func() {
		data, body, werr := ep.Respond(s.answers, in, enc, waited)
		s.send(r, enc, count, data, werr)
		land(body)
	}
	shed := func(werr *wire.Error) { s.send(r, enc, count, nil, werr); land(nil) }
	if werr := s.enqueue(job{queued: queued, count: count, run: run, shed: shed, release: release, give: give}); werr != nil {
		land(nil)
		return werr
	}
	return nil
}

// answerEarly answers a checked request on a worker while the copy loads
// (early), within RevisionWait, once the copy holds what it reads beside
// the request's own keys (earlyLoaded).
func (ep endpoint[Req, Res]) answerEarly(s *Service, r micro.Request, in Req, enc answers.Encoding, count *counters, arrived time.Time, onCallback bool) {
	release := s.admit()
	if release == nil {
		s.refuse(r, enc, count, answers.ErrStopping, onCallback)
		return
	}
	give, werr := s.hold(ep.addresseeOf(r), count)
	if werr != nil {
		release()
		s.refuse(r, enc, count, werr, onCallback)
		return
	}
	run := func() {
		ctx, cancel := s.answers.EarlyWait()
		defer cancel()
		if !s.answers.EarlyLoaded(ctx) {
			s.send(r, enc, count, nil, s.answers.StillLoading())
			return
		}
		if s.mirror.Ready() {
			// The copy came whole while the request waited: it answers
			// as it answers any request, revisions waited for, where a
			// read of the node alone could refuse. Its time in the queue
			// starts again, as after a wait for revisions, and so does
			// its place (hold).
			give()
			if werr := ep.answerWhole(s, r, in, enc, count, time.Now(), true); werr != nil {
				s.send(r, enc, count, nil, werr)
			}
			return
		}
		if ep.Unavailable != nil {
			if werr := ep.Unavailable(in); werr != nil {
				s.send(r, enc, count, nil, werr)
				return
			}
		}
		data, werr := ep.Early(ctx, in, enc)
		if werr == nil {
			count.early.Add(1)
		}
		s.send(r, enc, count, data, werr)
	}
	if werr := s.enqueue(job{queued: arrived, count: count, run: run, shed: func(werr *wire.Error) { s.send(r, enc, count, nil, werr) }, release: release, give: give}); werr != nil {
		s.refuse(r, enc, count, werr, onCallback)
	}
}

// job is a checked request waiting in the queue for a worker.
type job struct {
	queued  time.Time // when it entered the queue
	count   *counters
	run     func()                 // builds and sends the answer
	shed    func(werr *wire.Error) // sends an error instead
	release func()                 // once the answer or error is sent (admit)
	give    func()                 // its asker's place (hold), given back with release
}

// enqueue puts a job in the queue for a worker, or returns the refusal of
// a full queue, counted, with the job's place given back and the job
// released.
func (s *Service) enqueue(j job) *wire.Error {
	select {
	case s.queue <- j:
		return nil
	default:
		j.done()
		j.count.queueFull.Add(1)
		return s.overloaded()
	}
}

// done gives back the job's place and releases it.
func (j job) done() {
	j.give()
	j.release()
}

// hold takes a place of who's for a request (places), or returns the
// refusal of an asker that holds every place it may, counted.
func (s *Service) hold(who admission.Asker, count *counters) (give func(), werr *wire.Error) {
	if give = s.places.Take(who); give == nil {
		count.askerFull.Add(1)
		return nil, s.places.AskerFull(who)
	}
	return give, nil
}

// waitTicket is what a request that waits on a goroutine of its own holds
// (enterWaiting): counted in, so that Stop waits for it; one of its asker's
// places; one slot. givePlace gives the place back early; done gives all
// back.
type waitTicket struct {
	givePlace, done func()
}

// enterWaiting admits a request that waits on a goroutine of its own (for
// revisions, a write, another instance's answer), taking one of slots,
// or returns the refusal to send instead: full's when slots has none free.
func (s *Service) enterWaiting(who admission.Asker, count *counters, slots chan struct{}, full func() *wire.Error) (waitTicket, *wire.Error) {
	release := s.admit()
	if release == nil {
		return waitTicket{}, answers.ErrStopping
	}
	give, werr := s.hold(who, count)
	if werr != nil {
		release()
		return waitTicket{}, werr
	}
	select {
	case slots <- struct{}{}:
	default:
		give()
		release()
		return waitTicket{}, full()
	}
	return waitTicket{givePlace: give, done: func() { <-slots; give(); release() }}, nil // give is idempotent
}

// overloaded is the refusal of a request that finds the queue full.
func (s *Service) overloaded() *wire.Error {
	return wire.Errorf(wire.CodeUnavailable, "the server is overloaded: %d requests already queue for an answer; ask again shortly", cap(s.queue))
}

// work answers queued requests until the queue is closed. A request that
// waited in the queue longer than MaxQueueWait is not computed: its asker
// has most likely given up, and answering it would only delay the next. It
// gets a 503, cheap to send.
func (s *Service) work() {
	for j := range s.queue {
		if waited := time.Since(j.queued); waited > s.maxQueueWait {
			j.count.shed.Add(1)
			j.shed(wire.Errorf(wire.CodeUnavailable, "the server is overloaded: the request waited %s in its queue, more than %s; ask again shortly",
				waited.Round(time.Millisecond), s.maxQueueWait))
		} else {
			j.run()
		}
		j.done()
	}
}

// afterFlight answers a request that waited for an identical one's answer
// (flights), on the goroutine that landed it: with its body and a tail of
// its own, as a reused answer is; or, if none was built, as any request,
// without waiting again.
func (ep endpoint[Req, Res]) afterFlight(s *Service, r micro.Request, in Req, enc answers.Encoding, count *counters, queued time.Time, waited time.Duration, body []byte) {
	if body == nil {
		if werr := ep.answerWhole(s, r, in, enc, count, queued, false); werr != nil {
			s.send(r, enc, count, nil, werr)
		}
		return
	}
	answer, werr := ep.Reuse(s.answers, in, enc, body, waited)
	s.send(r, enc, count, answer, werr)
}

// admit counts a request in before it is answered off the callback, unless
// Stop has begun (nil): Stop then waits for every admitted request. The
// request's release counts it out once its answer or error is sent; a
// second call does nothing.
func (s *Service) admit() (release func()) {
	s.gate.RLock()
	defer s.gate.RUnlock()
	if s.closed {
		return nil
	}
	s.inFlight.Add(1)
	return sync.OnceFunc(s.inFlight.Done)
}

// send sends a worker's answer, or its refusal, to the request's reply
// subject on the answering connection; an answer over LargeAnswer bytes is
// queued for the large answers' sender (see LargeAnswer), or refused with a
// 503 when its queue is full. Workers do not call req.Respond or req.Error:
// micro reads what those record when the callback returns, which for a
// worker is before they run; send's own counters stand in for it.
func (s *Service) send(r micro.Request, enc answers.Encoding, count *counters, data []byte, werr *wire.Error) {
	msg := &nats.Msg{Subject: r.Reply(), Header: nats.Header{"Content-Type": {enc.ContentType()}}}
	if werr == nil {
		if int64(len(data)+headerLen(msg.Header)) > s.conn.MaxPayload() {
			// The page budget keeps answers under max_payload; reaching this
			// is a bug in that budget.
			werr = wire.Errorf(wire.CodeInternal, "the answer is %d bytes, more than the %d the NATS server carries (max_payload); ask with a smaller page_size", len(data), s.conn.MaxPayload())
		} else {
			msg.Data = data
		}
	}
	if werr == nil && len(msg.Data) > LargeAnswer {
		if s.large.offer(msg, func(err error) { s.sent(r, count, msg, nil, err) }) {
			s.observeAnswer(r, nil)
			return
		}
		count.largeShed.Add(1)
		msg.Data = nil
		werr = wire.Errorf(wire.CodeUnavailable, "the server holds as many large answers for your connection as it may (%d MiB, or %d MiB in all) until NATS takes them; read your answers, then ask again",
			LargeQueuePerAsker>>20, LargeQueueBytes>>20)
		msg.Header.Set(wire.ErrorHeader, werr.Sentence())
		msg.Header.Set(wire.ErrorCodeHeader, werr.Code().String())
		s.logFailure(r, werr)
		s.observeAnswer(r, werr)
		if !s.large.refuse(msg, func(err error) { s.sent(r, count, msg, werr, err) }) {
			count.answerErrors.Add(1) // not sent: its asker's timeout fires
		}
		return
	}
	if werr != nil {
		msg.Header.Set(wire.ErrorHeader, werr.Sentence())
		msg.Header.Set(wire.ErrorCodeHeader, werr.Code().String())
		s.logFailure(r, werr)
	}
	s.observeAnswer(r, werr)
	s.sent(r, count, msg, werr, s.answer.PublishMsg(msg))
}

// sent counts an answer or refusal once it is published, or failed to be.
func (s *Service) sent(r micro.Request, count *counters, msg *nats.Msg, werr *wire.Error, err error) {
	switch {
	case err != nil:
		s.logger.Warn("sending an answer failed", "subject", r.Subject(), "err", err, "bytes", len(msg.Data))
		count.answerErrors.Add(1)
	case werr != nil:
		count.answerErrors.Add(1)
	default:
		count.answered.Add(1)
	}
}

// logFailure logs a 5xx answer at warn, at most once a minute a code: a
// flood of them must not flood the log, and a failure of NATS fails every
// asker at once. A 4xx is the asker's to fix: debug only.
func (s *Service) logFailure(r micro.Request, werr *wire.Error) {
	if werr.Code() < 500 {
		s.logger.Debug("request refused", "subject", r.Subject(), "code", int(werr.Code()), "reason", werr.Sentence())
		return
	}
	s.warnings.Log(slog.LevelWarn, "failed with "+strconv.Itoa(int(werr.Code())), "", "request failed",
		"subject", r.Subject(), "code", int(werr.Code()), "reason", werr.Sentence())
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

// refuse answers an error before the request is handed to a worker. On
// the micro callback (onCallback), micro sends it on its connection and
// counts it (num_errors, last_error), as it counts any error its handler
// sends; after the callback returned (past a door), micro can count
// nothing, and the service sends it on Config.AnswerConn and counts it in
// its stats data (refused).
func (s *Service) refuse(r micro.Request, enc answers.Encoding, count *counters, werr *wire.Error, onCallback bool) {
	s.logFailure(r, werr)
	s.observeAnswer(r, werr)
	if onCallback {
		if err := r.Error(werr.Code().String(), werr.Sentence(), nil, micro.WithHeaders(enc.Headers())); err != nil {
			s.logger.Warn("sending an error failed", "subject", r.Subject(), "err", err)
		}
		return
	}
	msg := &nats.Msg{Subject: r.Reply(), Header: nats.Header(enc.Headers())}
	msg.Header.Set(wire.ErrorHeader, werr.Sentence())
	msg.Header.Set(wire.ErrorCodeHeader, werr.Code().String())
	count.refused.Add(1)
	if err := s.answer.PublishMsg(msg); err != nil {
		s.logger.Warn("sending an error failed", "subject", r.Subject(), "err", err)
	}
}

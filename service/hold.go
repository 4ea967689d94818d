package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// An instance may serve some partitions of the mesh only (Config.Hold): it
// holds the copy of their nodes, answers their nodes and providers (whose
// requests nats-server routes by partition), and hands any other request
// about nodes it does not hold to an instance that holds them: it asks the
// holder on the partition's relay subject (wire.RelaySubject), with the
// request's data and headers, on its own inbox, and sends the asker the
// holder's answer as it came. A partition that no instance serves is a 503
// that says so: nats-server tells "no responders" only to a publisher that
// listens on the reply subject, so a request published with its asker's
// reply subject would be dropped unanswered.

// relayedName is the name of the endpoint on which a holder of partition p
// takes the requests of endpoint name that other instances hand it:
// compose-relayed-3. They are endpoints of the process's own micro
// instance, not of the partition's, which a flood of one of its askers
// shuts out: a walk of every node crosses every partition.
func relayedName(name string, p int) string { return name + "-relayed-" + strconv.Itoa(p) }

// checkHold checks Config.Hold against Config.Partitions.
func checkHold(hold []int, partitions int) error {
	if len(hold) == 0 {
		return nil
	}
	if partitions < 2 {
		return fmt.Errorf("service: Config.Hold lists partitions of an unpartitioned mesh: set Partitions (serve --partitions) to the mappings' count")
	}
	seen := map[int]bool{}
	for _, p := range hold {
		if p < 0 || p >= partitions {
			return fmt.Errorf("service: Config.Hold lists partition %d, outside 0 to %d (Partitions %d)", p, partitions-1, partitions)
		}
		if seen[p] {
			return fmt.Errorf("service: Config.Hold lists partition %d twice", p)
		}
		seen[p] = true
	}
	return nil
}

// HoldsNode reports whether this instance serves node's partition: its copy
// holds node's records, and its plans are this instance's to write while
// it holds the partition's seat.
func (s *Service) HoldsNode(node string) bool {
	return s.held == nil || s.held[wire.PartitionOf(node, len(s.held))]
}

// holdsPartition reports whether this instance serves partition p.
func (s *Service) holdsPartition(p int) bool {
	return s.held == nil || (p >= 0 && p < len(s.held) && s.held[p])
}

// Held returns the partitions this instance serves, in order; nil when it
// serves the whole mesh.
func (s *Service) Held() []int {
	var held []int
	for p, ok := range s.held {
		if ok {
			held = append(held, p)
		}
	}
	return held
}

// uint32s returns partitions as the stats carry them.
func uint32s(partitions []int) []uint32 {
	var out []uint32
	for _, p := range partitions {
		out = append(out, uint32(p))
	}
	return out
}

// relayedRequest is a request another instance handed on: read as it was
// asked, on the verb's subject.
type relayedRequest struct {
	micro.Request
	subject string
}

func (r relayedRequest) Subject() string { return r.subject }

// isRelayed reports whether r was handed on by another instance: it is not
// handed on again.
func isRelayed(r micro.Request) bool {
	_, ok := r.(relayedRequest)
	return ok
}

// relayWait bounds the wait for a holder's answer: past it, the asker has
// most likely given up (nats.go's requests wait 2 s, the nats CLI's 5 s).
const relayWait = 10 * time.Second

// relay hands r to a holder of partition p and sends its answer to r's
// asker, off the callback; no holder, or none that answers, is a 503. A
// request handed on waits as one waiting for revisions does: it takes one
// of MaxWaiting places, and one of its asker's (MaxPerAsker).
func (s *Service) relay(r micro.Request, who admission.Asker, p int, enc answers.Encoding, count *counters, onCallback bool) {
	t, werr := s.enterWaiting(who, count, s.waiting, func() *wire.Error {
		return wire.Errorf(wire.CodeUnavailable, "%d requests already wait for revisions or for another instance's answer; ask again shortly", cap(s.waiting))
	})
	if werr != nil {
		s.refuse(r, enc, count, werr, onCallback)
		return
	}
	asked := &nats.Msg{Subject: wire.RelaySubject(p, r.Subject()), Data: r.Data(), Header: nats.Header(r.Headers())}
	count.relayed.Add(1)
	go func() {
		defer t.done()
		ctx, cancel := context.WithTimeout(s.stopping, relayWait)
		defer cancel()
		answer, err := wire.Request(ctx, s.conn, wire.RoleServer, wire.ServerIdentity, asked)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			s.send(r, enc, count, nil, wire.Errorf(wire.CodeUnavailable, "the request reads nodes of partition %d, which this instance does not serve, and no instance serves it now; ask again shortly", p))
		case errors.Is(err, context.DeadlineExceeded):
			s.send(r, enc, count, nil, wire.Errorf(wire.CodeUnavailable, "the request reads nodes of partition %d, which this instance does not serve, and the instance that serves it did not answer within %s; ask again shortly", p, relayWait))
		case err != nil:
			s.send(r, enc, count, nil, wire.Errorf(wire.CodeUnavailable, "the request reads nodes of partition %d, which this instance does not serve, and it could not be handed to one that does (%v); ask again shortly", p, err))
		default:
			// Sent as this instance's own answer: a large one through
			// the large answers' sender, counted and observed.
			var werr *wire.Error
			if errors.As(wire.ErrorOf(answer), &werr) {
				s.send(r, enc, count, nil, werr)
				return
			}
			s.send(r, enc, count, answer.Data, nil)
		}
	}()
}

// relayReplies is the inbox prefix an instance asks a holder on (relay):
// the answering identity's own, where no asker's request is answered.
var relayReplies = wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity) + "."

// notHeldHere refuses a request handed on to this instance about a
// partition it does not serve: handed on again, it could go round.
func notHeldHere(p int) *wire.Error {
	return wire.Errorf(wire.CodeUnavailable, "the request was handed to an instance that does not serve partition %d; ask again shortly", p)
}

// relays reports whether the endpoint takes requests about other
// partitions' nodes, which an instance that serves some hands on: the
// operators' (any node) and the providers' (their walk of every node). A
// node's requests are about itself, routed to its partition.
func (ep endpoint[Req, Res]) relays() bool {
	return ep.PartitionOf != nil && ep.owner != wire.RoleNode
}

// registerRelay adds the endpoint on which partition p's holder takes the
// requests that other instances hand it (relays), if the endpoint has one:
// without a door, since the instance that handed it on let it in.
func (ep endpoint[Req, Res]) registerRelay(s *Service, svc micro.Service, p int) error {
	if !ep.relays() {
		return nil
	}
	var res Res
	name := relayedName(ep.Name, p)
	count := s.counters[name]
	prepare := func(r micro.Request) func(bool) {
		asked, _, _ := wire.Unrelayed(r.Subject())
		return ep.prepare(s, count, relayedRequest{Request: r, subject: asked})
	}
	return s.addEndpoint(svc, nil, name, ep.Subject, wire.RelaySubject(p, ep.subjectOf()), "", 0, prepare,
		ep.NewRequest().ProtoReflect().Descriptor().FullName(), res.ProtoReflect().Descriptor().FullName())
}

// relays and registerRelay of a write verb: a write is of its asker's own
// records, routed to its partition.
func (v writeVerb[Req]) relays() bool { return false }

func (v writeVerb[Req]) registerRelay(*Service, micro.Service, int) error { return nil }

// answersTo reports whether r's reply subject is one the service answers
// for who: an inbox of the askers' (Config.ReplyPrefixes), or, for a
// request another instance handed on, that instance's own.
func (s *Service) answersTo(r micro.Request, who admission.Asker) bool {
	if isRelayed(r) {
		return strings.HasPrefix(r.Reply(), relayReplies)
	}
	return s.replies.AnswersTo(r.Reply(), who.Role, who.Name)
}

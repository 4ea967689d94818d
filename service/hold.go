package service

import (
	"context"
	"errors"
	"fmt"
	"slices"
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

// relayedName is the name of the endpoint on which a holder of a partition
// takes the requests of endpoint name that other instances hand it:
// compose-relayed, on mesh-provisioner.partition.compose.<p>. They are
// endpoints of a micro instance of the partition's own (openRelay), not of
// the one of its addressed endpoints, which a flood of one of its askers
// shuts out: a walk of every node crosses every partition.
func relayedName(name string) string { return name + "-relayed" }

// relayCounted is the subject by which a relay endpoint's counters are
// found (counterOf): its relay subject without the partition.
func relayCounted(subject string) string {
	return strings.TrimSuffix(wire.RelaySubject(0, subject), ".0")
}

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

// partitionSet returns, by partition of n, whether list names it.
func partitionSet(list []int, n int) []bool {
	set := make([]bool, n)
	for _, p := range list {
		set[p] = true
	}
	return set
}

// HoldsNode reports whether this instance serves node's partition: it
// answers node, and writes its plans while it holds the partition's seat.
func (s *Service) HoldsNode(node string) bool {
	held := s.held.Load()
	return held == nil || (*held)[wire.PartitionOf(node, len(*held))]
}

// HoldsPartition reports whether this instance serves partition p: it
// answers its nodes, and writes their plans while it holds p's seat.
func (s *Service) HoldsPartition(p int) bool {
	held := s.held.Load()
	return held == nil || (p >= 0 && p < len(*held) && (*held)[p])
}

// copyHolds reports whether the copy holds the nodes of partition p: those
// served, and those let go of less than releaseGrace ago.
func (s *Service) copyHolds(p int) bool {
	held := s.copyHeld.Load()
	return held == nil || (p >= 0 && p < len(*held) && (*held)[p])
}

// Held returns the partitions this instance serves, in order; nil when it
// serves the whole mesh.
func (s *Service) Held() []int {
	held := s.held.Load()
	if held == nil {
		return nil
	}
	out := []int{}
	for p, ok := range *held {
		if ok {
			out = append(out, p)
		}
	}
	return out
}

// releaseGrace is how long a partition let go (Hold) stays in the copy:
// the requests about its nodes taken before are answered from it, the
// waits for a revision among them (RevisionWait) and those handed on by
// other instances (relayWait) too.
const releaseGrace = relayWait

// ErrWholeMesh is returned by Hold on an instance that serves the whole
// mesh: its copy holds every node, and it was started so.
var ErrWholeMesh = errors.New("service: the instance serves the whole mesh (Config.Hold and HoldChanges unset), and Hold cannot change that")

// Hold has the instance serve the partitions listed from now on, in place
// of those it serves. It first reads the nodes of those it did not hold
// into its copy (every key of the state buckets once more, as at the
// start), and only then answers their requests, beside the instance that
// served them so far; it stops answering those it lets go at once, and
// drops their nodes from its copy releaseGrace later, once the requests it
// took about them are answered. It returns once it serves what is listed,
// or with ctx's error, the partitions still being read then not served
// (the read goes on: a later Hold of them is quicker).
//
// Each instance that serves a partition answers its requests; which of them
// writes its plans is its seat's to say (the instance package).
func (s *Service) Hold(ctx context.Context, partitions []int) error {
	if s.held.Load() == nil {
		return ErrWholeMesh
	}
	if err := checkHold(partitions, len(s.partitions)); err != nil {
		return err
	}
	s.holding.Lock()
	defer s.holding.Unlock()
	want := partitionSet(partitions, len(s.partitions))
	served := *s.held.Load()
	kept := make([]bool, len(want))
	letGo, adding := false, false
	for p := range want {
		kept[p] = served[p] && want[p]
		letGo = letGo || (served[p] && !want[p])
		adding = adding || (want[p] && !s.copyHolds(p))
	}
	if letGo {
		s.serve(kept)
	}
	// The copy holds partitions not wanted (let go now, or read by a
	// Hold cut short): dropped once their grace is over.
	for p, held := range *s.copyHeld.Load() {
		if held && !want[p] {
			s.afterGrace(s.dropLetGo)
			break
		}
	}
	if adding {
		copyHeld := slices.Clone(want)
		for p, ok := range *s.copyHeld.Load() {
			copyHeld[p] = copyHeld[p] || ok
		}
		s.copyHeld.Store(&copyHeld)
		s.filled = s.followers.Hold(copyHeld)
	}
	// Wait for the read of the partitions taken on, this Hold's or one
	// cut short before it whose partitions it takes on too.
	if s.filled != nil {
		select {
		case <-s.filled:
		case <-ctx.Done():
			return fmt.Errorf("read the nodes of the partitions taken on: %w", ctx.Err())
		case <-s.stopping.Done():
			return errors.New("service: stopped")
		}
	}
	s.serve(want)
	s.logger.Info("serving partitions", "partitions", s.Held())
	return nil
}

// serve has the instance answer the partitions held says yes to, and no
// other: the micro instances of those let go are stopped, those of the
// ones taken on are opened (once the endpoints are added, if they are not
// yet). Called with s.holding held.
func (s *Service) serve(held []bool) {
	s.registering.Lock()
	defer s.registering.Unlock()
	registered := s.registered && !s.unregistered
	if registered {
		// Closed before held changes: this instance's own relay
		// endpoints take no request it hands on.
		for _, pt := range s.partitions {
			if !held[pt.index] {
				s.closePartition(pt)
			}
		}
	}
	s.held.Store(&held)
	if !registered {
		return
	}
	if err := s.openPartitions(); err != nil {
		// Its relay endpoints, or its addressed ones, are not all
		// there: the weighing opens the partition again.
		s.logger.Error("opening the partitions taken on", "err", err)
	}
}

// afterGrace runs drop on its own goroutine releaseGrace from now, unless
// the service is stopping.
func (s *Service) afterGrace(drop func()) {
	s.registering.Lock()
	defer s.registering.Unlock()
	if !s.unregistered { // Stop waits for the watchers after setting it
		s.watchers.Go(drop)
	}
}

// dropLetGo drops from the copy, releaseGrace after a partition was let
// go, the nodes of those the instance does not serve then.
func (s *Service) dropLetGo() {
	select {
	case <-time.After(s.releaseGrace):
	case <-s.stopping.Done():
		return
	}
	s.holding.Lock()
	defer s.holding.Unlock()
	served := *s.held.Load()
	if slices.Equal(served, *s.copyHeld.Load()) {
		return
	}
	copyHeld := slices.Clone(served)
	s.copyHeld.Store(&copyHeld)
	s.followers.LetGo(copyHeld)
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

// relayAgain is how long a request handed on waits for its holder's
// answer before it is handed on once more (wire.RequestAgain): a holder
// killed with it in hand never answers, and its asker, who waits 2 s or
// more, is then answered by another holder rather than left waiting for
// relayWait. A holder that answers later (a request waiting for a
// revision) answers both; the verbs handed on only read.
const relayAgain = time.Second

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
		answer, err := wire.RequestAgain(ctx, s.conn, wire.RoleServer, wire.ServerIdentity, asked, relayAgain)
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

// registerRelay adds to svc, partition p's relay instance (openRelay), the
// endpoint on which p's holder takes the requests that other instances hand
// it (relays), if the endpoint has one: without a door, since the instance
// that handed it on let it in.
func (ep endpoint[Req, Res]) registerRelay(s *Service, svc micro.Service, p int) error {
	if !ep.relays() {
		return nil
	}
	var res Res
	name := relayedName(ep.Name)
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

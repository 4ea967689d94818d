package service

import (
	"log/slog"
	"time"

	"github.com/nats-io/nats.go/micro"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// handlerOf returns the micro handler of an endpoint: prepare reads and
// checks each request on the callback, where micro counts its refusals,
// and returns what answers it. On an endpoint whose subject names its asker
// (owner set; the asker is the token after prefix) a door of the
// endpoint's own stands before prepare, at most rate a second of each asker
// (no bound when zero), and the answer waits in the asker's line; the
// service closes the door as it stops. Elsewhere the answer follows on the
// callback. A request dropped past the rate is unanswered, but for one an
// asker each second, answered on the callback with why (a 503 micro
// counts), to the asker's own inbox only. In partition pt (when not nil),
// the request is read without the partition's token, and its drops are
// counted for the partition too; every partition's instance of the
// endpoint shares its door.
func (s *Service) handlerOf(name, prefix string, owner wire.Role, rate int, count *counters, pt *partition, prepare func(micro.Request) func(onCallback bool)) micro.Handler {
	if owner == "" {
		return micro.HandlerFunc(func(r micro.Request) {
			if answer := prepare(r); answer != nil {
				answer(true)
			}
		})
	}
	d := s.doorOf(name, owner, rate, count)
	return micro.HandlerFunc(func(r micro.Request) {
		if pt != nil {
			r = pt.unpartitioned(r)
		}
		who := admission.Asker{Role: owner, Name: admission.AskerToken(r.Subject(), prefix)}
		if admitted, tell := d.Admit(who); !admitted {
			if pt != nil {
				s.dropped(pt, who.Name)
			}
			switch {
			case !tell:
			case s.replies.AnswersTo(r.Reply(), who.Role, who.Name):
				r = s.observed(r, name, time.Now())
				s.refuse(r, answers.EncodingOf(r), count, pastRate(who, name, rate), true)
			default:
				d.Untell(who)
			}
			return
		}
		if answer := prepare(r); answer != nil {
			d.Put(who, answer)
		}
	})
}

// doorOf returns the door of the addressed endpoint name, made at its
// first call and kept in count: one for every partition's instance of it.
func (s *Service) doorOf(name string, owner wire.Role, rate int, count *counters) *admission.Door[func(bool)] {
	s.doorsMu.Lock()
	defer s.doorsMu.Unlock()
	if count.door != nil {
		return count.door
	}
	// Precomputed, so that a flood's drops allocate nothing to be told.
	cause := "dropped at " + name
	message := "requests of a " + string(owner) + " dropped unanswered at the " + name + " endpoint: it asked faster than its rate (serve --max-rate-per-asker; --max-write-rate-per-asker on the write verbs), or than its requests are read"
	d := admission.NewDoor(admission.LineLength, PendingMsgsLimit, float64(rate), func(answer func(bool)) { answer(false) }, func(who admission.Asker) {
		s.warnings.Log(slog.LevelWarn, cause, who.Name, message)
	})
	count.door = d
	s.doors = append(s.doors, d)
	return d
}

// pastRate is the refusal of a request dropped at the door of endpoint
// name because who asked faster than rate a second.
func pastRate(who admission.Asker, name string, rate int) *wire.Error {
	slower := "ask less often"
	if name == wire.PutEndpoint || name == wire.DeleteEndpoint {
		slower = "write a module's records at once with apply, or write less often"
	}
	return wire.Errorf(wire.CodeUnavailable, "%s %s asks %s more than %d times a second, the most the server takes of one %s: it drops what comes past that unanswered (this answer says why, at most once a second); %s",
		who.Role, keys.Echo(who.Name), name, rate, who.Role, slower)
}

// pendingLimits bounds the pending buffer of an endpoint whose asker its
// subject names (owner set: it has a door) or not.
func pendingLimits(owner wire.Role) micro.EndpointOpt {
	if owner == "" {
		return micro.WithEndpointPendingLimits(PendingMsgsLimit, PendingBytesLimit)
	}
	return micro.WithEndpointPendingLimits(DoorPendingMsgsLimit, PendingBytesLimit)
}

// closeDoors stops the doors letting requests in and returns once what they
// let in is served: after micro stopped reading requests, before the
// workers stop.
func (s *Service) closeDoors() {
	s.doorsMu.Lock()
	doors := s.doors
	s.doorsMu.Unlock()
	for _, d := range doors {
		d.Close()
	}
}

// topDroppers is how many askers an endpoint's stats name (dropped_by_asker).
const topDroppers = 10

// dropped is the count of the endpoint's requests dropped at its door.
func (c *counters) dropped() uint64 {
	if c.door == nil {
		return 0
	}
	_, all := c.door.Drops(0)
	return all
}

// droppedByAsker names the askers with the most requests dropped at the
// endpoint's door.
func (c *counters) droppedByAsker() []*provisionerv1.AskerDrops {
	if c.door == nil {
		return nil
	}
	top, _ := c.door.Drops(topDroppers)
	out := make([]*provisionerv1.AskerDrops, 0, len(top))
	for _, x := range top {
		out = append(out, &provisionerv1.AskerDrops{Role: string(x.Who.Role), Name: x.Who.Name, Dropped: x.Count})
	}
	return out
}

package service

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/wire"
)

// Read-only accessors and the latency hook for the operator's HTTP endpoints
// (package internal/ops): nothing here changes what the service answers.

// CopyState is one bucket's copy as an operator sees it.
type CopyState struct {
	Bucket string
	// Revision is the revision the copy has reached.
	Revision uint64
	// Loaded says the copy holds the bucket's initial values.
	Loaded bool
	// Behind says the copy is known to lag the bucket (its watcher was
	// lost and is catching up).
	Behind bool
	// Malformed counts the keys out of the bucket's shape, over a node's
	// budget included.
	Malformed int
}

// Copies returns the state of each bucket's copy, the registry first.
func (s *Service) Copies() []CopyState {
	return []CopyState{
		copyState(s.mirror.Registry), copyState(s.mirror.Needs),
		copyState(s.mirror.Applied), copyState(s.mirror.Collect),
		copyState(s.mirror.Manifests),
	}
}

func copyState[R proto.Message](c *mirror.Copy[R]) CopyState {
	_, malformed, _, revision := c.Counts()
	return CopyState{Bucket: c.Bucket(), Revision: revision, Loaded: c.Ready(), Behind: c.Behind(), Malformed: malformed}
}

// Ready returns nil while the service answers right: its endpoints are
// registered and not stopped, every copy holds its bucket's initial values
// and none is known to lag, and the registry is in the copy. Otherwise the
// error says why not, in one sentence.
func (s *Service) Ready() error {
	var why []string
	if s.micro.Stopped() {
		why = append(why, "the micro service is stopped")
	} else if n := len(s.micro.Info().Endpoints); n != len(s.counters) {
		why = append(why, fmt.Sprintf("%d of %d endpoints are registered", n, len(s.counters)))
	}
	if loading := s.mirror.Loading(); len(loading) > 0 {
		why = append(why, "the copy is still loading "+strings.Join(loading, ", "))
	}
	if behind := s.mirror.Behind(); len(behind) > 0 {
		why = append(why, "the copy is behind on "+strings.Join(behind, ", ")+" (a watcher is catching up)")
	}
	if s.mirror.Registry.Ready() && s.mirror.Registry.Empty() {
		why = append(why, "the registry is not in the copy yet")
	}
	if len(why) == 0 {
		return nil
	}
	return errors.New(strings.Join(why, "; "))
}

// Observer hears each answer the service sends or refusal it makes: the
// endpoint's name, the code (200 for an answer) and the time from the
// request's arrival to its sending. It is called before the message is
// published, on the goroutine that sends it, so it must be fast.
type Observer func(endpoint string, code int, took time.Duration)

// observedRequest is a request whose answer is measured.
type observedRequest struct {
	micro.Request
	endpoint string
	arrived  time.Time
}

// observed wraps r so that its answer is measured, when an observer is set.
// Errors sent through it still reach the request micro counts.
func (s *Service) observed(r micro.Request, endpoint string, arrived time.Time) micro.Request {
	if s.observe == nil {
		return r
	}
	return &observedRequest{Request: r, endpoint: endpoint, arrived: arrived}
}

// observeAnswer reports an answer (werr nil) or a refusal to the observer.
func (s *Service) observeAnswer(r micro.Request, werr *wire.Error) {
	o, ok := r.(*observedRequest)
	if !ok {
		return
	}
	code := 200
	if werr != nil {
		code = int(werr.Code())
	}
	s.observe(o.endpoint, code, time.Since(o.arrived))
}

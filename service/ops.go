package service

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/wire"
)

// Read-only accessors and the latency hook for the operator's HTTP endpoints
// (package internal/observe/ops): nothing here changes what the service answers.

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

// Conn is one of the service's connections, with what it carries.
type Conn struct {
	// Use says what the service does on it: "requests", "answers",
	// "large answers", "watchers and writes", or several of them joined
	// with ", " when one connection carries them.
	Use  string
	Conn *nats.Conn
}

// Conns returns the connections the service reads and sends on, each once,
// in the order of Config's fields: Conn, AnswerConn, LargeConn, WatchConn.
func (s *Service) Conns() []Conn {
	var out []Conn
	for _, c := range []Conn{{"requests", s.conn}, {"answers", s.answer}, {"large answers", s.large.conn}, {"watchers and writes", s.store.js.Conn()}} {
		if c.Conn == nil {
			continue
		}
		if i := slices.IndexFunc(out, func(o Conn) bool { return o.Conn == c.Conn }); i >= 0 {
			out[i].Use += ", " + c.Use
			continue
		}
		out = append(out, c)
	}
	return out
}

// ProviderState is a provider as the service's copy knows it: from the
// manifests nodes declare of it, and from its bucket, which the copy
// follows on the writing connection once a composition names it.
type ProviderState struct {
	Provider string
	// Declared counts the nodes that declare a manifest of it; Manifest is
	// the digest of the newest, at ManifestRevision. Zero and empty when
	// none does.
	Declared         int
	Manifest         string
	ManifestRevision uint64
	// Bucket is its bucket, <provider>_bound.
	Bucket string
	// Followed says the copy holds the bucket's keys, up to Revision.
	Followed bool
	Revision uint64
	// Behind says a composition named the bucket and its keys are not in:
	// not read yet, or it cannot be read (the writing identity's grant may
	// lack it: permissions --server-writer --providers).
	Behind bool
}

// Providers returns the providers the copy knows, by name: those a node
// declares a manifest of, and those whose bucket the copy follows or waits
// for. A bucket named, read and empty (or missing) is not told apart from
// one never named: BoundBuckets counts them all.
func (s *Service) Providers() []ProviderState {
	byName := map[string]*ProviderState{}
	of := func(name string) *ProviderState {
		p := byName[name]
		if p == nil {
			p = &ProviderState{Provider: name}
			byName[name] = p
		}
		return p
	}
	manifests, _ := s.mirror.Manifests.All()
	for _, e := range manifests {
		if e.Malformed != nil {
			continue
		}
		r := e.Record
		p := of(r.GetProvider())
		p.Declared++
		if r.GetRevision() >= p.ManifestRevision {
			p.Manifest, p.ManifestRevision = r.GetDigest(), r.GetRevision()
		}
	}
	// Each provider's bucket is <provider>_bound: the registry's entry
	// of kind bound, and what the bind verb writes (writeStore.bound).
	providerOf := func(bucket string) (string, bool) {
		name, ok := strings.CutSuffix(bucket, wire.BoundSuffix)
		return name, ok && name != ""
	}
	for bucket, revision := range s.mirror.Bound.Revisions() {
		if name, ok := providerOf(bucket); ok {
			p := of(name)
			p.Followed, p.Revision = true, revision
		}
	}
	for _, bucket := range s.mirror.Bound.Behind() {
		if name, ok := providerOf(bucket); ok {
			of(name).Behind = true
		}
	}
	out := make([]ProviderState, 0, len(byName))
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		p := byName[name]
		p.Bucket = wire.BoundBucket(name)
		out = append(out, *p)
	}
	return out
}

// BoundBuckets returns how many providers' buckets the copy was named
// (followed, waited for, found missing or failing) and how many keys it
// holds of them.
func (s *Service) BoundBuckets() (buckets, keys int) { return s.mirror.Bound.Counts() }

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

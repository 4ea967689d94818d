package answers

import (
	"context"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/wire"
)

// A Verb is one read verb: how its request is read, checked and answered
// from the copy. The service wraps each in an endpoint, the one adapter
// between micro and the verbs, in the shape of connect-go's
// NewUnaryHandler.
type Verb[Req, Res proto.Message] struct {
	Name, Subject string
	// NewRequest returns an empty request to decode into.
	NewRequest func() Req
	// Check refuses a request the verb cannot answer, on the micro callback,
	// so that micro counts the refusal.
	Check func(Req) *wire.Error
	// Waits are the revisions the request asks the copy to reach first.
	Waits func(Req) []RevisionWait
	// Unavailable, if set, refuses a request the copy cannot answer yet
	// with a 503, on the micro callback.
	Unavailable func(Req) *wire.Error
	// KeyOf returns the request as the answer cache knows it: without its
	// minimum revisions, which decide when it is answered, not what.
	KeyOf func(Req) string
	// StampOf identifies what the request's answer reads: an answer is reused
	// while its stamp is unchanged.
	StampOf func(Req) Stamp
	// Answer builds the answer of a checked request on a worker, but for
	// the fields Tail adds; budget is how many bytes the answer may take
	// once encoded as sizing says. done, if not nil, is called once the
	// answer is encoded and read no more: what it holds may then be reused.
	Answer func(req Req, enc Encoding, budget Budget) (out Res, t Timings, done func(), werr *wire.Error)
	// Encoded, if set, is tried before answer: it answers some requests
	// encoded already, as Answer would but for how the encoding orders
	// fields, cheaper (ok), and leaves the others to Answer.
	Encoded func(req Req, enc Encoding, budget Budget) (data []byte, t Timings, ok bool)
	// Early, if set, answers a checked request while the copy loads (it
	// is then the instance's whole answer, tail and all), rather than a
	// 503, once the copy holds the registry and manifests (earlyLoaded).
	Early func(ctx context.Context, req Req, enc Encoding) ([]byte, *wire.Error)
	// PartitionOf, on an instance that serves some partitions of the mesh
	// (Config.Holds), returns the partition whose nodes a checked request
	// reads (its node's, or the one its walk of every node is in), whose
	// holder answers it; false for a request that reads what every
	// instance holds (the registry, the manifests), and on a copy of the
	// whole mesh.
	PartitionOf func(Req) (int, bool)
	// Tail returns the fields added to every answer as it is sent, reused
	// or not: the revisions given, and the phases. It depends on nothing
	// else, so that an answer reused with the same revisions is the same.
	Tail func(req Req, t Timings, revs mirror.Revisions) Res
}

// Timings are where an answer's time went: the phases its tail reports.
type Timings struct {
	waited, read, resolve, items time.Duration
	// built is false for an answer reused from the cache.
	built bool
}

// A RevisionWait is a revision a request asks one bucket's copy to reach
// before it is answered.
type RevisionWait struct {
	bucket   revisionSource
	revision uint64
}

// revisionSource is the copy of a bucket a request can wait on: a
// provisioning bucket's (mirror.Watched) or a provider's (mirror.BoundBucket).
type revisionSource interface {
	Bucket() string
	Revision() uint64
	Behind() bool
	WaitFor(ctx context.Context, revision uint64) bool
}

// answerHeadroom is what an answer leaves of max_payload for its headers.
const answerHeadroom = 1024

// budget returns what a page may take: PageMaxBytes, and no more than
// one message carries.
func (s *Answers) budget() Budget {
	most := int(s.maxPayload()) - answerHeadroom
	if s.pageMaxBytes > 0 {
		return Budget{Fill: min(s.pageMaxBytes, most), Most: most}
	}
	return Budget{Fill: most, Most: most}
}

// Lookup returns the answer kept in the cache for a request, if what it
// read is unchanged: as it was last sent while the revisions it names are
// unchanged (no encoding, no copy) and the request waited for none, or
// with a new tail. It returns the request's cache key and the stamp it
// read too, for a request that misses.
func (ep Verb[Req, Res]) Lookup(s *Answers, in Req, enc Encoding, waited time.Duration) (data []byte, key CacheKey, st Stamp, ok bool) {
	key, st = CacheKey{endpoint: ep.Name, json: enc.json, request: ep.KeyOf(in)}, ep.StampOf(in)
	cached, hit := s.cache.get(key, st)
	if !hit {
		return nil, key, st, false
	}
	// Read after the stamp: the answer names revisions at least as new as
	// what it holds.
	revs := s.mirror.RevisionsNow()
	kept := cached.kept.Load()
	if kept.whole != nil && waited == 0 && kept.revisions.Same(revs) {
		return kept.whole, key, st, true
	}
	whole, werr := ep.withTail(s, in, enc, kept.body, Timings{waited: waited}, revs)
	if werr != nil {
		return nil, key, st, false
	}
	if waited == 0 {
		cached.kept.Store(&keptAnswer{body: enc.BodyOf(whole, kept.body), whole: whole, revisions: revs})
	}
	return whole, key, st, true
}

// Respond builds the encoded answer of a checked request on a worker, adds
// its tail and keeps it in the cache; it returns the body too, the answer
// without its tail.
func (ep Verb[Req, Res]) Respond(s *Answers, in Req, enc Encoding, waited time.Duration) (answer, body []byte, werr *wire.Error) {
	key := CacheKey{endpoint: ep.Name, json: enc.json, request: ep.KeyOf(in)}
	st := ep.StampOf(in)
	if cached, hit := s.cache.get(key, st); hit {
		// Built while the request queued.
		body := cached.body()
		whole, werr := ep.withTail(s, in, enc, body, Timings{waited: waited}, s.mirror.RevisionsNow())
		return whole, body, werr
	}
	body, t, werr := ep.build(s, in, enc)
	if werr != nil {
		return nil, nil, werr
	}
	t.waited, t.built = waited, true
	// Read after the build: the answer names revisions at least as new as
	// what it holds. The body is no one else's until it is cached: the
	// tail goes into its room, if it has some (JoinOwned), and the cache
	// keeps the answer's prefix; a body the tail was not added to in place
	// is kept as it was built, which holds no more than its bytes.
	answer, werr = ep.addTail(s, in, enc, body, t, s.mirror.RevisionsNow(), enc.JoinOwned)
	if werr != nil {
		return nil, nil, werr
	}
	if len(body) > 0 && &answer[0] == &body[0] {
		body = enc.BodyOf(answer, body)
	}
	s.cache.put(key, st, body)
	return answer, body, nil
}

// withTail adds an encoded answer's tail to a copy of it.
func (ep Verb[Req, Res]) withTail(s *Answers, in Req, enc Encoding, data []byte, t Timings, revs mirror.Revisions) ([]byte, *wire.Error) {
	return ep.addTail(s, in, enc, data, t, revs, enc.Join)
}

// addTail adds an encoded answer's tail to it with join.
func (ep Verb[Req, Res]) addTail(s *Answers, in Req, enc Encoding, data []byte, t Timings, revs mirror.Revisions, join func(data, tail []byte) []byte) ([]byte, *wire.Error) {
	tail, err := enc.Marshal(ep.Tail(in, t, revs))
	if err != nil {
		s.logger.Error("encoding an answer failed", "endpoint", ep.Name, "err", err)
		return nil, wire.NewError(wire.CodeInternal, "the server could not encode its answer; see its log")
	}
	return join(data, tail), nil
}

// build builds and encodes the answer of a checked request, without its
// tail. A page is filled measuring its items in binary, which is cheap; the
// rare JSON page whose text would not fit is filled again, measuring each
// item's text.
func (ep Verb[Req, Res]) build(s *Answers, in Req, enc Encoding) ([]byte, Timings, *wire.Error) {
	budget := s.budget()
	if ep.Encoded != nil {
		if data, t, ok := ep.Encoded(in, enc, budget); ok {
			return data, t, nil
		}
	}
	var data []byte
	var t Timings
	for _, sizing := range []Encoding{{}, enc} {
		out, built, done, werr := ep.Answer(in, sizing, budget)
		if werr != nil {
			return nil, t, werr
		}
		var err error
		data, err = enc.Marshal(out)
		if done != nil {
			done()
		}
		if err != nil {
			s.logger.Error("encoding an answer failed", "endpoint", ep.Name, "err", err)
			return nil, t, wire.NewError(wire.CodeInternal, "the server could not encode its answer; see its log")
		}
		t = built
		if len(data) <= budget.Fill || sizing == enc {
			break
		}
	}
	return data, t, nil
}

// WaitRevisions waits, at most RevisionWait, until every copy has reached
// the revision asked of it.
func (s *Answers) WaitRevisions(waits []RevisionWait) *wire.Error {
	ctx, cancel := context.WithTimeout(s.stopping, s.revisionWait)
	defer cancel()
	for _, w := range waits {
		if !w.bucket.WaitFor(ctx, w.revision) {
			if s.stopping.Err() != nil {
				return ErrStopping
			}
			why := ""
			if w.bucket.Behind() {
				why = " (its watcher was lost and is catching up)"
			}
			return wire.Errorf(wire.CodeUnavailable, "the server's copy of %s is at revision %d%s, behind the %d asked for, after waiting %s; ask again shortly",
				w.bucket.Bucket(), w.bucket.Revision(), why, w.revision, s.revisionWait)
		}
	}
	return nil
}

// Reuse adds a tail to body, an answer built for an identical request
// (flights), read now: its revisions are at least as new as what it holds.
func (ep Verb[Req, Res]) Reuse(s *Answers, in Req, enc Encoding, body []byte, waited time.Duration) ([]byte, *wire.Error) {
	return ep.withTail(s, in, enc, body, Timings{waited: waited}, s.mirror.RevisionsNow())
}

// Pending returns the revisions in asks the copy to reach that it has not
// reached yet.
func (ep Verb[Req, Res]) Pending(in Req) []RevisionWait {
	var pending []RevisionWait
	for _, w := range ep.Waits(in) {
		if w.revision > 0 && w.bucket.Revision() < w.revision {
			pending = append(pending, w)
		}
	}
	return pending
}

// ErrStopping is the refusal of a request that comes, or would be answered,
// once the service's Stop has begun.
var ErrStopping = wire.NewError(wire.CodeUnavailable, "the server is stopping; ask another instance or again shortly")

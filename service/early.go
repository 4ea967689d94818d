package service

import (
	"context"
	"strings"
	"time"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/wire"
)

// An instance alone on the bus answers compose before its copy is whole:
// it reads the asking node's keys alone (mirror.ReadNode) and composes
// them as the copy would at the revisions it read. A large mesh takes a
// second or more to load, during which a restarted instance would
// otherwise answer every node 503. An instance that joins others takes no
// request before its copy is whole (Start), so it never reads this way.

// earlyMaxBound is the most providers' buckets a node's needs may name
// for it to be read alone: each is one more watcher made while the copy
// loads, on a node's request, and a node asks for itself as often as it
// likes (at most Config.Concurrency reads at once).
const earlyMaxBound = 16

// earlyLoaded waits until the copy holds what a read of one node reads
// beside the node's keys, the registry and the manifests (a few keys,
// loaded first), and reports whether it does before ctx is done.
func (s *Service) earlyLoaded(ctx context.Context) bool {
	for _, c := range []mirror.Watched{s.mirror.Registry, s.mirror.Manifests} {
		select {
		case <-c.Loaded():
		case <-ctx.Done():
			return false
		}
	}
	return true
}

// composeEarly answers a compose request while the copy loads, from its
// node's keys read alone; a node it cannot read alone, or a read that
// fails, gets the 503 of a loading copy, with why.
func (s *Service) composeEarly(ctx context.Context, in *provisionerv1.ComposeRequest, enc encoding) ([]byte, *wire.Error) {
	start := time.Now()
	m, err := s.mirror.ReadNode(ctx, s.js, in.GetNode(), earlyMaxBound)
	read := time.Since(start)
	if err != nil {
		// Logged as every 503 is, with its sentence (logFailure).
		return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s and could not read node %s alone (%v); ask again shortly",
			strings.Join(s.mirror.Loading(), ", "), in.GetNode(), err)
	}
	needs, _, _ := m.Needs.Group(in.GetNode())
	buckets := namedBuckets(m, needs)
	// What was read is not waited on: a revision it has not reached was
	// written after the read, and is the whole copy's to answer. No
	// worker is held for it.
	for _, w := range composeWaits(m, in, buckets) {
		if w.bucket.Revision() < w.revision {
			return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s, and what it read for node %s is at revision %d of %s, behind the %d asked for; ask again shortly",
				strings.Join(s.mirror.Loading(), ", "), in.GetNode(), w.bucket.Revision(), w.bucket.Bucket(), w.revision)
		}
	}
	ep := endpoint[*provisionerv1.ComposeRequest, *provisionerv1.ComposeResponse]{
		name:   wire.ComposeEndpoint,
		answer: composeAnswer(m, dropViews),
		tail: func(_ *provisionerv1.ComposeRequest, t timings, revs revisions) *provisionerv1.ComposeResponse {
			return &provisionerv1.ComposeResponse{Revisions: revs.only(buckets).proto(), Phases: phasesOf(t)}
		},
	}
	data, t, werr := ep.build(s, in, enc)
	if werr != nil {
		return nil, werr
	}
	// The read of the node's keys is the answer's read phase too.
	t.read, t.built = t.read+read, true
	return ep.withTail(s, in, enc, data, t, revisionsNow(m))
}

package answers

import (
	"context"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/wire"
)

// An instance alone on the bus answers a node before its copy is whole:
// it reads the asking node's keys alone (mirror.ReadNode) and answers
// compose, or the node's own records, as the copy would at the revisions
// it read; the registry and the manifests, loaded first, from its copy. A
// large mesh takes seconds to load, during which a restarted instance
// would otherwise answer every node 503. An instance that joins others
// takes no request before its copy is whole (Start), so it never reads
// this way.

// Reads of a node alone are bounded across every node: earlyReadsPerSecond a
// second, after a burst of as many. Each costs JetStream a direct get in
// each state bucket (two more for a bucket without a key of the node's,
// and a bucket's state and a watcher for one with more than a batch holds:
// mirror.ReadNode), and a node asks for itself as often as it likes:
// without the bound, a node asking in a loop while the copy loads would
// have the server read thousands of times a second, and slow the load.
const earlyReadsPerSecond = 100

// earlyReadsPerNode is the most reads of one node alone in a second, a tenth
// of the bound across every node. Without it, one node asking for itself in
// a loop while the copy loads takes that whole bound, and every other node
// gets a 503 until the copy is whole. A node that asks for its plan and
// its three kinds of records at start takes four.
const earlyReadsPerNode = 10

// earlyBound admits reads of a node alone: all bounds them across every
// node, byNode counts each node's in the current second. Only the reads
// admitted are counted, so byNode holds no more nodes than all admits in a
// second.
type earlyBound struct {
	all     *rate.Limiter
	perNode int
	mu      sync.Mutex
	second  time.Time
	byNode  map[string]int
}

func newEarlyBound(perSecond, perNode int) *earlyBound {
	return &earlyBound{all: rate.NewLimiter(rate.Limit(perSecond), perSecond), perNode: perNode, byNode: map[string]int{}}
}

// admit takes a read of node alone at now, or says which bound refuses it.
func (b *earlyBound) admit(node string, now time.Time) (nodeBound, meshBound bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if now.Sub(b.second) >= time.Second {
		b.second = now
		clear(b.byNode)
	}
	if b.byNode[node] >= b.perNode {
		return true, false
	}
	if !b.all.AllowN(now, 1) {
		return false, true
	}
	b.byNode[node]++
	return false, false
}

// earlyMaxUnread is the most providers' buckets not read yet that a read of
// a node alone waits for, on a worker.
const earlyMaxUnread = 16

// earlyLoaded waits until the copy holds what a read of one node reads
// beside the node's keys, the registry and the manifests (a few keys,
// loaded first), and reports whether it does before ctx is done.
func (s *Answers) earlyLoaded(ctx context.Context) bool {
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
func (s *Answers) composeEarly(ctx context.Context, in *provisionerv1.ComposeRequest, enc Encoding) ([]byte, *wire.Error) {
	start := time.Now()
	m, werr := s.readAlone(ctx, in.GetNode())
	if werr != nil {
		return nil, werr
	}
	// The providers' buckets its needs name are the copy's, named now and
	// waited for, as the whole copy's answer waits for them; on a worker,
	// so for a few only: a node that names more has them looked for, and
	// is answered once they are read.
	needs, _, _ := m.Needs.Group(in.GetNode())
	buckets := namedBuckets(m, needs)
	var unread []*mirror.BoundBucket
	for _, bucket := range buckets {
		if bb := m.Bound.Bucket(bucket); !bb.Loaded() {
			unread = append(unread, bb)
		}
	}
	if len(unread) > earlyMaxUnread {
		return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s, and node %s's needs name %d providers' buckets it has not read yet, more than the %d a read alone waits for; ask again shortly",
			strings.Join(s.mirror.Loading(), ", "), in.GetNode(), len(unread), earlyMaxUnread)
	}
	for _, bb := range unread {
		if !bb.WaitLoaded(ctx) {
			return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s, and has not read %s, which node %s's needs name; ask again shortly",
				strings.Join(s.mirror.Loading(), ", "), bb.Bucket(), in.GetNode())
		}
	}
	read := time.Since(start)
	if werr := s.readBehind(composeWaits(m, in, buckets)); werr != nil {
		return nil, werr
	}
	return answerFrom(s, m, in, enc, read, Verb[*provisionerv1.ComposeRequest, *provisionerv1.ComposeResponse]{
		Name:   wire.ComposeEndpoint,
		Answer: composeAnswer(m, dropViews),
		Tail: func(_ *provisionerv1.ComposeRequest, t Timings, revs mirror.Revisions) *provisionerv1.ComposeResponse {
			return &provisionerv1.ComposeResponse{Revisions: revs.Only(buckets).Proto(), Phases: phasesOf(t)}
		},
	})
}

// provisioningEarly answers a provisioning request while the copy loads:
// the registry and the manifests from their copies, loaded already; a
// node's needs, applied records or items from its keys read alone. What
// spans every node waits for the whole copy.
func (s *Answers) provisioningEarly(ctx context.Context, in *provisionerv1.ProvisioningRequest, enc Encoding) ([]byte, *wire.Error) {
	m, read := s.mirror, time.Duration(0)
	switch what := WhatOf(in); {
	case what == provisionerv1.What_WHAT_REGISTRY || what == provisionerv1.What_WHAT_MANIFESTS:
	case in.GetNode() == "":
		return nil, s.StillLoading()
	default:
		start := time.Now()
		var werr *wire.Error
		if m, werr = s.readAlone(ctx, in.GetNode()); werr != nil {
			return nil, werr
		}
		read = time.Since(start)
	}
	if werr := s.readBehind(provisioningWaits(m, in)); werr != nil {
		return nil, werr
	}
	return answerFrom(s, m, in, enc, read, Verb[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse]{
		Name:   wire.ProvisioningEndpoint,
		Answer: provisioningAnswer(m, partitions{}), // one node's, or what every instance holds
		Tail:   provisioningTail,
	})
}

// readAlone reads node's keys alone (mirror.ReadNode), within the bounds
// on such reads (earlyBound); a node it does not read gets a 503 that says
// why, logged as every 503 is (logFailure).
func (s *Answers) readAlone(ctx context.Context, node string) (*mirror.Mirror, *wire.Error) {
	switch nodeBound, meshBound := s.earlyReads.admit(node, time.Now()); {
	case nodeBound:
		return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s, and reads node %s alone at most %d times a second meanwhile; ask again shortly",
			strings.Join(s.mirror.Loading(), ", "), node, s.earlyReads.perNode)
	case meshBound:
		return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s, and reads at most %d nodes alone a second meanwhile; ask again shortly",
			strings.Join(s.mirror.Loading(), ", "), s.earlyReads.all.Burst())
	}
	m, err := s.followers.ReadNode(ctx, node)
	if err != nil {
		return nil, wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s and could not read node %s alone (%v); ask again shortly",
			strings.Join(s.mirror.Loading(), ", "), node, err)
	}
	return m, nil
}

// readBehind refuses a request that asks for a revision after what was
// read for it. It is not waited for, holding a worker: it was written
// after the read, and is the whole copy's to answer.
func (s *Answers) readBehind(waits []RevisionWait) *wire.Error {
	for _, w := range waits {
		if w.bucket.Revision() < w.revision {
			return wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s, and its read of %s is at revision %d, behind the %d asked for; ask again shortly",
				strings.Join(s.mirror.Loading(), ", "), w.bucket.Bucket(), w.bucket.Revision(), w.revision)
		}
	}
	return nil
}

// answerFrom answers a request early as ep, whose answer and tail read m,
// builds and encodes it, with nothing kept: read is how long reading m
// took, the answer's read phase.
func answerFrom[Req, Res proto.Message](s *Answers, m *mirror.Mirror, in Req, enc Encoding, read time.Duration, ep Verb[Req, Res]) ([]byte, *wire.Error) {
	data, t, werr := ep.build(s, in, enc)
	if werr != nil {
		return nil, werr
	}
	t.read, t.built = t.read+read, true
	return ep.withTail(s, in, enc, data, t, m.RevisionsNow())
}

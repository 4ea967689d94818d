package answers

import (
	"cmp"
	"context"
	"log/slog"
	"strings"
	"sync"
	"time"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/observe/ratelog"
	"github.com/novox/mesh-provisioner/wire"
)

// Config is what New needs; every field is required but where its comment
// says otherwise.
type Config struct {
	// Copy is the watched copy the verbs answer from, and Followers keep
	// it (and read a node's keys alone while it loads).
	Copy      *mirror.Mirror
	Followers *mirror.Watchers
	// Stopping ends when the service stops: requests waiting for
	// revisions are refused then.
	Stopping context.Context
	// MaxPayload returns the most bytes NATS carries in one message, which
	// an answer's page must fit.
	MaxPayload func() int64
	// PageMaxBytes is the most bytes the server fills a page with (zero:
	// what one message carries); a larger item is still sent alone.
	PageMaxBytes int
	// RevisionWait bounds a wait for revisions the copy has not reached.
	RevisionWait time.Duration
	// SlowCompose is the duration over which a composition is logged with
	// its phases.
	SlowCompose time.Duration
	// CacheMaxBytes is the most bytes of encoded answers kept for reuse,
	// and half as many again hold nodes' last compositions a module at a
	// time; zero keeps none of either.
	CacheMaxBytes int
	// EarlyReadsPerSecond bounds the reads of a node alone while the copy
	// loads, over every node; zero means the default.
	EarlyReadsPerSecond int
	// Partitions and Holds, on an instance that serves some partitions
	// of a mesh of Partitions (serve --hold), say which: the copy holds
	// their nodes alone, a walk of every node (a listing, a provider's
	// provisions) goes partition by partition, its page token saying
	// where, and each request is answered by an instance that holds the
	// partition it reads (Verb.PartitionOf). Nil Holds: the copy holds the
	// whole mesh.
	Partitions int
	Holds      func(partition int) bool
	// Logger receives failures; Warnings what an asker can cause, at most
	// once a minute per cause and asker.
	Logger   *slog.Logger
	Warnings *ratelog.Limiter
}

// Answers answers the read verbs from the copy: one Verb each, and what
// they share (the answer cache, nodes' kept sections, the providers'
// buckets each node's needs name).
type Answers struct {
	mirror       *mirror.Mirror
	followers    *mirror.Watchers
	earlyReads   *earlyBound
	partitions   partitions
	stopping     context.Context
	maxPayload   func() int64
	pageMaxBytes int
	revisionWait time.Duration
	slowCompose  time.Duration
	logger       *slog.Logger
	warnings     *ratelog.Limiter

	cache    *answerCache
	sections *sectionCache // nil: none kept
	// boundNamed holds, by node, the providers' buckets its needs name
	// and the stamps they were last named at (boundUnread).
	boundNamed sync.Map
}

// New returns the answers of the read verbs from cfg's copy.
func New(cfg Config) *Answers {
	a := &Answers{
		mirror: cfg.Copy, followers: cfg.Followers, stopping: cfg.Stopping, maxPayload: cfg.MaxPayload, pageMaxBytes: cfg.PageMaxBytes,
		revisionWait: cfg.RevisionWait, slowCompose: cfg.SlowCompose, logger: cfg.Logger, warnings: cfg.Warnings,
		earlyReads: newEarlyBound(cmp.Or(cfg.EarlyReadsPerSecond, earlyReadsPerSecond), earlyReadsPerNode),
		cache:      newAnswerCache(cfg.CacheMaxBytes),
	}
	if cfg.Holds != nil {
		a.partitions = partitions{n: cfg.Partitions, holds: cfg.Holds}
	}
	if cfg.CacheMaxBytes > 0 {
		a.sections = newSectionCache(cfg.CacheMaxBytes / 2)
	}
	return a
}

// Provisioning is the verb mesh-provisioner.provisioning.
func (s *Answers) Provisioning() Verb[*provisionerv1.ProvisioningRequest, *provisionerv1.ProvisioningResponse] {
	return s.provisioningEndpoint()
}

// Compose is the verb mesh-provisioner.compose.
func (s *Answers) Compose() Verb[*provisionerv1.ComposeRequest, *provisionerv1.ComposeResponse] {
	return s.composeEndpoint()
}

// Provisions is the verb mesh-provisioner.provisions.
func (s *Answers) Provisions() Verb[*provisionerv1.ProvisionsRequest, *provisionerv1.ProvisionsResponse] {
	return s.provisionsEndpoint()
}

// CacheStats returns the answer cache's counts, for the endpoints' stats.
func (s *Answers) CacheStats() *provisionerv1.AnswerCacheStats { return s.cache.stats() }

// EarlyLoaded reports, within ctx, whether the copy holds what an early
// answer reads beside the request's own keys.
func (s *Answers) EarlyLoaded(ctx context.Context) bool { return s.earlyLoaded(ctx) }

// EarlyWait bounds an early answer's wait for what it reads beside the
// request's own keys: RevisionWait, or until the service stops.
func (s *Answers) EarlyWait() (context.Context, context.CancelFunc) {
	return context.WithTimeout(s.stopping, s.revisionWait)
}

// StillLoading is the refusal of a request the copy cannot answer yet.
func (s *Answers) StillLoading() *wire.Error {
	return wire.Errorf(wire.CodeUnavailable, "the server is still loading its copy of %s; ask again shortly", strings.Join(s.mirror.Loading(), ", "))
}

package service

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/observe/ratelog"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/service/plans"
	"github.com/novox/mesh-provisioner/wire"
)

// ErrBucketMissing is returned by Start when a provisioning bucket does not
// exist; create the buckets with buckets.Ensure first.
var ErrBucketMissing = mirror.ErrBucketMissing

// Config holds what Start needs. In every field, zero means the default. A
// negative value means "no limit", and only the fields whose comment says so
// take one (NodeMaxKeys, NodeMaxBytes, ProviderMaxKeys): Start refuses a negative value
// anywhere else.
type Config struct {
	// Conn is the connection the service answers on, and watches the
	// buckets through unless WatchConn is set. Required; the caller owns it.
	Conn *nats.Conn
	// WatchConn, if set, is the connection the bucket watchers read on: one
	// of their own keeps a flood of requests on Conn from delaying their
	// heartbeats, which would make them take their consumers for lost. It
	// is also the one the write verbs store through: the writing
	// identity's (permissions.ServerWriter), never the answering one's.
	// The caller owns it.
	WatchConn *nats.Conn
	// AnswerConn, if set, is the connection answers and refusals are sent
	// on, so that Conn only reads requests: nats.go writes a connection's
	// socket holding the lock its reader needs now and then, and a flood's
	// answers written on the connection that reads the flood slowed its
	// reading until nats-server dropped it as a slow consumer. Nil answers
	// on Conn. The caller owns it.
	AnswerConn *nats.Conn
	// LargeConn, if set, is the connection answers over LargeAnswer bytes
	// are sent on, so that a large answer stalled by a client that does not
	// read delays no smaller one (see LargeAnswer); nil sends them on AnswerConn,
	// still off the endpoints' callbacks. The caller owns it.
	LargeConn *nats.Conn
	// Version is the service's semantic version, as micro discovery shows it.
	// Empty means "0.0.0-dev".
	Version string
	// Logger receives the service's logs; nil means slog.Default().
	Logger *slog.Logger
	// Concurrency is how many answers are built at once; zero means twice
	// GOMAXPROCS. Further requests wait in a queue of QueuePerWorker
	// requests a worker; a request that finds it full is refused (503).
	Concurrency int
	// MaxQueueWait is how long a request may wait in the queue for a
	// worker: one that waited longer is answered 503 without being
	// computed, since its asker has most likely given up. Zero means
	// DefaultMaxQueueWait.
	MaxQueueWait time.Duration
	// RevisionWait bounds how long a request that asks for a revision the
	// copy has not reached waits before a 503; zero means 5s.
	RevisionWait time.Duration
	// SlowCompose is the duration over which a composition is logged with
	// its phases; zero means 100ms.
	SlowCompose time.Duration
	// MaxWaiting bounds the requests waiting for revisions at once, or for
	// another instance's answer (Hold); more are refused with a 503 rather
	// than held. Zero means 1024.
	MaxWaiting int
	// MaxPerAsker bounds the requests of one node or provider (whom a
	// node- or provider-addressed subject names) that wait for revisions,
	// queue for a worker or are being answered at once; more are refused
	// with a 503 until some are answered, so that one asker cannot take the
	// places of the others. Operators' unscoped subjects are not bounded by
	// it. Zero means DefaultMaxPerAsker; negative (NoLimit) means no limit.
	MaxPerAsker int
	// MaxRatePerAsker bounds the requests a second that one node or
	// provider makes on each of its own subjects, as many at once: more
	// are dropped where they arrive, counted by asker, so that a flood
	// costs the service as little as reading it; one drop an asker a
	// second is answered with why (a 503), the others not at all. Zero means
	// DefaultMaxRatePerAsker; negative (NoLimit) means no limit.
	MaxRatePerAsker int
	// Partitions, 2 or more, is how many partitions nats-server's subject
	// mapping splits the nodes and providers into (wire.PartitionMappings,
	// which the server must be configured with): each partition's
	// addressed endpoints answer on its own subjects, as a micro instance
	// of their own, and a partition one of whose askers floods is
	// unsubscribed for a while so that nats-server drops its requests
	// before sending them. Zero or 1: one subject each, unpartitioned.
	Partitions int
	// Hold, with Partitions, lists the partitions this instance serves
	// (serve --hold): its copy holds the records of their nodes alone (the
	// registry, the manifests and the providers' buckets whole), it
	// answers their nodes' and providers' verbs, and it hands a request
	// about another partition's nodes (an operator's, or a page of a walk
	// of every node) to an instance that holds that partition, which
	// answers the asker (wire.RelaySubject). RunPlans writes the plans of
	// those whose seats it is told it holds (PlansConfig.Holds). Empty:
	// every partition, and the copy holds the whole mesh, unless
	// HoldChanges is set. Service.Hold changes it while the instance runs.
	Hold []int
	// HoldChanges, with Partitions, says that the partitions this
	// instance serves change while it runs (Service.Hold, serve --hold
	// auto): it starts with those Hold lists, none if it is empty.
	HoldChanges bool
	// FirstHold, with HoldChanges, returns the partitions the instance
	// starts with, in place of Hold: Start calls it once the buckets are
	// bound. Binding asks nats-server's JetStream API for each bucket's
	// stream, which it answers only when no other API request waits; an
	// instance that shares the partitions tells the others of itself in
	// FirstHold (the instance package), and bound first, it serves what
	// it is dealt at once, rather than after the others' consumers of
	// their shares. Start may call it again if it fails after it.
	FirstHold func(ctx context.Context) ([]int, error)
	// Member, with HoldChanges, is this instance's name among the
	// instances that share the partitions (the instance package's): the
	// micro instances of its partitions tell it (wire.MemberMetadata), so
	// that each finds which partitions the others serve (DiscoverPeers).
	Member string
	// MaxWriteRatePerAsker is MaxRatePerAsker for the write verbs, whose
	// every request JetStream stores. Zero means
	// DefaultMaxWriteRatePerAsker; negative (NoLimit) means no limit.
	MaxWriteRatePerAsker int
	// NodeMaxKeys and NodeMaxBytes are the most keys and value bytes the
	// copy holds of one node in one state bucket: keys beyond them are not
	// decoded nor held, and are reported as malformed with a reason that
	// names the budget. Zero means DefaultNodeMaxKeys and
	// DefaultNodeMaxBytes; negative (NoLimit) means no limit.
	NodeMaxKeys  int
	NodeMaxBytes int
	// ProviderMaxKeys is the most keys the copy holds of one provider's
	// bucket: one that holds more is not followed, its keys dropped (its
	// provisions pending) and the bucket listed behind, until it holds
	// fewer; each provider writes its bucket as it likes. Zero means
	// DefaultProviderMaxKeys; negative (NoLimit) means no limit.
	ProviderMaxKeys int
	// AnswerCacheMaxBytes is the most bytes of encoded answers kept for
	// reuse; zero means DefaultAnswerCacheMaxBytes. It cannot be lifted.
	// Half as many again hold nodes' last compositions, a module at a
	// time, for the composition asked right after a need is written.
	AnswerCacheMaxBytes int
	// PageMaxBytes is the most bytes the server fills one page of an
	// answer with; zero means DefaultPageMaxBytes. A page never exceeds
	// what one NATS message carries (max_payload), and an item larger than
	// PageMaxBytes is still sent alone.
	PageMaxBytes int
	// NoAnswerCache keeps no answer, nor any part of one, for reuse: every
	// request is computed whole.
	NoAnswerCache bool
	// ReplyPrefixes are the subject prefixes the service answers to; nil
	// means wire.ReplyPrefixes(). A request whose reply subject starts with
	// none of them gets no answer at all, on any path: it is counted in the
	// endpoint's stats (refused_replies) and logged at warn, at most once a
	// second. A prefix must end with "." and may not start with "$", where
	// JetStream, KV and system subjects are.
	ReplyPrefixes []string
	// Seat reports the provisioner seat for the endpoints' stats: whether
	// this instance holds it, since when it holds it or stands by, and who
	// holds it as far as it knows. Nil leaves the seat out of the stats.
	Seat func() (held bool, since time.Time, holder string)
	// PartitionSeats reports, with Hold, the partitions whose seats this
	// instance holds, for the endpoints' stats; nil leaves them out.
	PartitionSeats func() []int
	// Observe, if set, hears every answer and refusal with its code and
	// latency (see Observer).
	Observe Observer

	// boundRetry and boundForget, in tests, replace how often the copy
	// looks again for a provider's bucket found missing and how long it
	// keeps one that nothing names (mirror.Bound.SetTimings).
	boundRetry, boundForget time.Duration
	// releaseGrace, in tests, replaces how long a partition let go stays
	// in the copy (Service.Hold).
	releaseGrace time.Duration
	// earlyReadsPerSecond, in tests, replaces the bound on reads of a
	// node alone (earlyReadsPerSecond): a bound under what the test's
	// machine reads, so that it is the bound a test sees.
	earlyReadsPerSecond int
}

// NoLimit lifts the limit of a Config field that takes it.
const NoLimit = -1

// Defaults of Config.
const (
	DefaultRevisionWait = 5 * time.Second
	DefaultSlowCompose  = 100 * time.Millisecond
	DefaultMaxWaiting   = 1024
	// A node asks for its plan and its records, a page at a time: a few
	// requests at once. 64 is an eighth of the queue on 2 cores (4
	// workers, QueuePerWorker each) and a sixteenth of DefaultMaxWaiting.
	DefaultMaxPerAsker = 64
	// A node asks a few times for each change of its plan, and writes its
	// records one at a time, at most a few thousand a second: 10,000 a
	// second is well above that, and a few percent of a core answered
	// from the cache, for a node that floods.
	DefaultMaxRatePerAsker = 10_000
	// A node writes a record for each of its needs as they change, a
	// module's at once with apply: 1,000 writes a second on one verb is
	// far above that, and keeps another node's compose p99 within 2x of
	// quiet while one writes as fast as it can (make bench-fair).
	DefaultMaxWriteRatePerAsker = 1_000
	// A node of a real mesh has tens of modules with tens of needs each:
	// 10,000 keys and 4 MiB of values a bucket leave it ample room.
	DefaultNodeMaxKeys  = 10_000
	DefaultNodeMaxBytes = 4 << 20
	// A provider binds a key for each need of it: a million keys is a
	// mesh of some 100,000 nodes with ten needs of the provider each, and
	// about 80 MiB of the copy.
	DefaultProviderMaxKeys = 1_000_000
	// Enough for the answers of a few thousand nodes asked again and again.
	DefaultAnswerCacheMaxBytes = 64 << 20
	// Half of nats-server's default max_payload, above a large node's
	// composition in binary (60 modules x 25 needs: 395-430 KB; 800-875 KB
	// in JSON, which comes in two pages): what the answer cache keeps of
	// one page and the write buffer nats.go keeps at the largest message
	// sent follow it (a node at its --node-max-bytes grew the service's
	// resident memory some 2.5 MiB less than with 1 MiB pages).
	DefaultPageMaxBytes = 512 << 10
	// DefaultMaxQueueWait is under the 2s that NATS clients commonly give a
	// request (nats.go's own default timeout) and well under the nats
	// CLI's 5s: an answer computed after it still reaches such a client.
	DefaultMaxQueueWait = time.Second
)

// Load shedding. Requests wait in two places: the endpoint subscription's
// pending buffer, before the micro callback reads them, and the service's
// queue, between the callback and a worker. The callback only decodes and
// checks, so the buffer drains fast; it is bounded so that a flood is
// dropped there (counted, and logged once per burst) rather than held in
// memory: a request dropped there gets no answer, and its asker's timeout
// fires.
const (
	// PendingMsgsLimit and PendingBytesLimit bound each endpoint's pending
	// buffer (nats.go's defaults are 512Ki messages and 64MiB).
	PendingMsgsLimit  = 4096
	PendingBytesLimit = 16 << 20
	// DoorPendingMsgsLimit bounds the pending buffer of an endpoint with a
	// door (handlerOf), whose callback only classifies and counts: a
	// node's flood is read whole and dropped at its door, and the buffer
	// absorbs the moments the callback is not scheduled. With 4,096, a
	// flood of 650,000 requests a second overflowed it in those moments
	// and lost another node's requests with the flood's (make bench-fair:
	// 9 of 50; with 65,536, none). It holds some 20 MiB when full.
	DoorPendingMsgsLimit = 16 * PendingMsgsLimit
	// QueuePerWorker is the length of the queue for workers, per worker.
	QueuePerWorker = 128
	// flightWaiters bounds the requests that wait for an identical
	// request's answer being built (flights), over every endpoint: two
	// endpoints' pending buffers, a few MiB.
	flightWaiters = 2 * PendingMsgsLimit
)

// Service is a running mesh-provisioner micro service.
type Service struct {
	micro  micro.Service
	conn   *nats.Conn
	answer *nats.Conn   // answers and refusals go out on it
	large  *largeSender // of answers over LargeAnswer bytes
	mirror *mirror.Mirror
	// followers keep the copy, and read a node's keys alone while it
	// loads (the answers' early reads).
	followers *mirror.Watchers
	// answers answers the read verbs from the copy.
	answers *answers.Answers
	// store is what the write verbs store through; writing holds a
	// token for each write being stored (MaxConcurrentWrites).
	store   *writeStore
	writing chan struct{}
	// places bounds what one asker holds of the queue and the waiting
	// requests' places (MaxPerAsker).
	places *admission.Places
	// doors are the addressed endpoints' (handlerOf), closed by Stop.
	// maxRatePerAsker and maxWriteRatePerAsker are the doors' rates
	// (handlerOf): no bound when zero.
	maxRatePerAsker, maxWriteRatePerAsker int
	doorsMu                               sync.Mutex
	doors                                 []*admission.Door[func(bool)]
	// partitions are Config.Partitions' (none when fewer than 2): their
	// micro instances are opened and shut out under registering.
	partitions []*partition
	// held says, by partition, which this instance serves (Config.Hold,
	// Hold); nil: every one. A slice stored is not changed after.
	held atomic.Pointer[[]bool]
	// holding orders the changes of what is held (Hold); copyHeld is what
	// the copy holds: the partitions served, and those let go of less
	// than releaseGrace ago (stored under holding).
	holding      sync.Mutex
	copyHeld     atomic.Pointer[[]bool]
	releaseGrace time.Duration
	// filled is closed once the copy holds copyHeld's nodes whole: the
	// last read of partitions taken on (mirror.Watchers.Hold), under
	// holding; nil before the first.
	filled <-chan struct{}
	// member is Config.Member, which the partitions' micro instances
	// tell.
	member string
	// flooded tells weighPartitions of a partition whose drops reached
	// floodAt since its last weighing.
	flooded chan *partition
	floodAt uint64
	// retired are the micro counts of the partitions' instances stopped,
	// by endpoint, which Stats adds to the open ones', so that a count
	// never goes back. Guarded by registering.
	retired map[string]*micro.EndpointStats
	version string
	logger  *slog.Logger

	// stopping is cancelled by Stop: watchers and waiting requests end.
	stopping     context.Context
	stop         context.CancelFunc
	watchers     sync.WaitGroup
	queue        chan job // checked requests, for the workers
	workers      sync.WaitGroup
	maxQueueWait time.Duration
	waiting      chan struct{} // a request waiting for a revision each

	// gate orders admit against Stop: once closed, nothing is admitted, so
	// inFlight.Wait sees every request that was.
	gate     sync.RWMutex
	closed   bool
	inFlight sync.WaitGroup
	// registering orders the endpoints' late registration against Stop:
	// once unregistered is set, none is added.
	registering  sync.Mutex
	unregistered bool
	registered   bool // the endpoints are added (registerEndpoints)

	replies *admission.Replies
	// warnings logs what an asker can cause (a refused reply, a slow
	// composition, a node over its budget, a failure under its flood) once
	// a minute per cause and asker, with the count kept back.
	warnings *ratelog.Limiter

	counters map[string]*counters                                // by endpoint name
	flights  *admission.Flights[answers.CacheKey, answers.Stamp] // nil without an answer cache: a waiter reuses the answer kept
	seat     func() (held bool, since time.Time, holder string)
	// partitionSeats is Config.PartitionSeats.
	partitionSeats func() []int
	observe        Observer
	// slow logs the bursts of requests dropped by a full pending buffer.
	slow *admission.BurstLog
	// plans counts what RunPlans did.
	plans    plans.Stats
	stopOnce sync.Once
}

// Validate reports what Start would refuse in cfg before it connects to
// anything: a missing Conn, a negative value in a field that takes no "no
// limit", a reply prefix CheckReplyPrefixes refuses. A caller that tries
// Start again while the bus fails checks it first, since no retry mends it.
func (cfg *Config) Validate() error {
	if cfg.Conn == nil {
		return errors.New("service: Config.Conn is required")
	}
	for _, f := range []struct {
		name     string
		negative bool
	}{
		{"Concurrency", cfg.Concurrency < 0},
		{"MaxQueueWait", cfg.MaxQueueWait < 0},
		{"RevisionWait", cfg.RevisionWait < 0},
		{"SlowCompose", cfg.SlowCompose < 0},
		{"MaxWaiting", cfg.MaxWaiting < 0},
		{"AnswerCacheMaxBytes", cfg.AnswerCacheMaxBytes < 0},
		{"PageMaxBytes", cfg.PageMaxBytes < 0},
		{"Partitions", cfg.Partitions < 0},
	} {
		if f.negative {
			return fmt.Errorf("service: Config.%s is negative: use zero for the default or a positive value; it has no \"no limit\"", f.name)
		}
	}
	if cfg.Partitions > wire.MaxPartitions {
		return fmt.Errorf("service: Config.Partitions is %d, more than %d", cfg.Partitions, wire.MaxPartitions)
	}
	if err := checkHold(cfg.Hold, cfg.Partitions); err != nil {
		return err
	}
	if cfg.Member != "" && !cfg.HoldChanges {
		return errors.New("service: Config.Member is set without HoldChanges: an instance that shares the partitions changes what it holds")
	}
	if cfg.FirstHold != nil && !cfg.HoldChanges {
		return errors.New("service: Config.FirstHold is set without HoldChanges: the partitions it returns change while the instance runs")
	}
	if cfg.HoldChanges && cfg.Partitions < 2 {
		return errors.New("service: Config.HoldChanges is set for an unpartitioned mesh: set Partitions (serve --partitions) to the mappings' count")
	}
	if cfg.ReplyPrefixes != nil {
		return admission.CheckReplyPrefixes(cfg.ReplyPrefixes)
	}
	return nil
}

// withDefaults returns cfg with each zero field at its default, and no
// answer cache with NoAnswerCache.
func (cfg Config) withDefaults() Config {
	if cfg.Version == "" {
		cfg.Version = "0.0.0-dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Concurrency == 0 {
		cfg.Concurrency = 2 * runtime.GOMAXPROCS(0)
	}
	if cfg.RevisionWait == 0 {
		cfg.RevisionWait = DefaultRevisionWait
	}
	if cfg.SlowCompose == 0 {
		cfg.SlowCompose = DefaultSlowCompose
	}
	if cfg.MaxWaiting == 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	if cfg.MaxRatePerAsker == 0 {
		cfg.MaxRatePerAsker = DefaultMaxRatePerAsker
	}
	if cfg.MaxWriteRatePerAsker == 0 {
		cfg.MaxWriteRatePerAsker = DefaultMaxWriteRatePerAsker
	}
	if cfg.MaxPerAsker == 0 {
		cfg.MaxPerAsker = DefaultMaxPerAsker
	}
	if cfg.AnswerCacheMaxBytes == 0 {
		cfg.AnswerCacheMaxBytes = DefaultAnswerCacheMaxBytes
	}
	if cfg.PageMaxBytes == 0 {
		cfg.PageMaxBytes = DefaultPageMaxBytes
	}
	if cfg.NoAnswerCache {
		cfg.AnswerCacheMaxBytes = 0
	}
	if cfg.NodeMaxKeys == 0 {
		cfg.NodeMaxKeys = DefaultNodeMaxKeys
	}
	if cfg.NodeMaxBytes == 0 {
		cfg.NodeMaxBytes = DefaultNodeMaxBytes
	}
	if cfg.ProviderMaxKeys == 0 {
		cfg.ProviderMaxKeys = DefaultProviderMaxKeys
	}
	if cfg.MaxQueueWait == 0 {
		cfg.MaxQueueWait = DefaultMaxQueueWait
	}
	if cfg.ReplyPrefixes == nil {
		cfg.ReplyPrefixes = wire.ReplyPrefixes()
	}
	return cfg
}

// Start opens the provisioning buckets, starts watching them and adds the
// micro service. Alone on the bus, it returns once the server has the
// endpoints' subscriptions, without waiting for the copy: until it is loaded
// (see WaitReady), the endpoints answer 503. Beside instances that answer
// already, it adds its endpoints only once its copy is whole, so that it
// takes no request from the queue group before it can answer it.
func Start(ctx context.Context, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	watchConn := cfg.WatchConn
	if watchConn == nil {
		watchConn = cfg.Conn
	}
	js, err := jetstream.New(watchConn, jetstream.WithPublishAsyncMaxPending(maxPendingPuts))
	if err != nil {
		return nil, err
	}
	s := &Service{
		conn:                 cfg.Conn,
		answer:               cmp.Or(cfg.AnswerConn, cfg.Conn),
		mirror:               mirror.New(),
		logger:               cfg.Logger,
		queue:                make(chan job, QueuePerWorker*cfg.Concurrency),
		maxQueueWait:         cfg.MaxQueueWait,
		waiting:              make(chan struct{}, cfg.MaxWaiting),
		places:               admission.NewPlaces(max(cfg.MaxPerAsker, 0)),
		maxRatePerAsker:      max(cfg.MaxRatePerAsker, 0),
		maxWriteRatePerAsker: max(cfg.MaxWriteRatePerAsker, 0),
		writing:              make(chan struct{}, MaxConcurrentWrites),
		counters:             map[string]*counters{},
		seat:                 cfg.Seat,
		partitionSeats:       cfg.PartitionSeats,
		observe:              cfg.Observe,
		partitions:           newPartitions(cfg.Partitions),
		flooded:              make(chan *partition, max(cfg.Partitions, 1)),
		version:              cfg.Version,
		member:               cfg.Member,

		replies:  admission.NewReplies(cfg.ReplyPrefixes),
		warnings: ratelog.New(cfg.Logger, ratelog.Period),
	}
	s.floodAt = floodAt(s.maxRatePerAsker, s.maxWriteRatePerAsker)
	if !cfg.NoAnswerCache {
		s.flights = admission.NewFlights[answers.CacheKey, answers.Stamp](flightWaiters)
	}
	s.mirror.SetBudget(mirror.Budget{Keys: max(cfg.NodeMaxKeys, 0), Bytes: max(cfg.NodeMaxBytes, 0)}, s.logBudget)
	s.mirror.Bound.SetMaxKeys(cfg.ProviderMaxKeys)
	if cfg.boundRetry > 0 || cfg.boundForget > 0 {
		s.mirror.Bound.SetTimings(cfg.boundRetry, cfg.boundForget)
	}
	if s.followers, err = s.mirror.Open(ctx, js, s.logger); err != nil {
		return nil, err
	}
	if s.store, err = openWriteStore(ctx, js, s.mirror); err != nil {
		return nil, err
	}
	var probe chan map[string]bool
	if cfg.FirstHold != nil {
		// Which partitions others serve is asked while FirstHold gathers
		// the members, not after it: an instance that starts with others
		// would otherwise wait probeTimeout more before it serves.
		probe = make(chan map[string]bool, 1)
		go func() { probe <- s.servedByOthers(ctx, nil) }()
		if cfg.Hold, err = cfg.FirstHold(ctx); err != nil {
			return nil, err
		}
		if err := checkHold(cfg.Hold, cfg.Partitions); err != nil {
			return nil, err
		}
	}
	var holds func(int) bool
	if len(cfg.Hold) > 0 || cfg.HoldChanges {
		held := partitionSet(cfg.Hold, cfg.Partitions)
		s.held.Store(&held)
		s.copyHeld.Store(&held)
		s.releaseGrace = cmp.Or(cfg.releaseGrace, releaseGrace)
		s.mirror.SetHolds(held)
		holds = s.copyHolds
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	s.answers = answers.New(answers.Config{
		Copy: s.mirror, Followers: s.followers, Stopping: s.stopping, MaxPayload: s.conn.MaxPayload, PageMaxBytes: cfg.PageMaxBytes,
		RevisionWait: cfg.RevisionWait, SlowCompose: cfg.SlowCompose, CacheMaxBytes: cfg.AnswerCacheMaxBytes,
		EarlyReadsPerSecond: cfg.earlyReadsPerSecond, Partitions: cfg.Partitions, Holds: holds,
		Logger: s.logger, Warnings: s.warnings,
	})
	s.watchers.Go(func() { s.followers.Run(s.stopping) })
	for range cfg.Concurrency {
		s.workers.Go(s.work)
	}
	s.large = newLargeSender(cmp.Or(cfg.LargeConn, s.answer))
	s.slow = admission.NewBurstLog(s.logger, "requests dropped: an endpoint's pending buffer is full (slow consumer)", admission.BurstQuiet)
	// The counters are made before AddService makes the stats handler
	// live: it reads the map unlocked, so the map is never written after.
	for _, ep := range s.endpoints() {
		name, subject := ep.names()
		s.counters[name] = &counters{subject: subject}
		if holds != nil && ep.relays() {
			s.counters[relayedName(name)] = &counters{subject: relayCounted(subject)}
		}
	}

	var served map[string]bool // before this instance answers discovery too
	if probe != nil {
		served = <-probe
	} else {
		served = s.servedByOthers(ctx, s.othersServe)
	}
	othersServe := s.othersServe(served)
	s.micro, err = micro.AddService(cfg.Conn, s.microConfig(cfg.Version))
	if err != nil {
		s.stopWatchers()
		return nil, fmt.Errorf("add micro service: %w", err)
	}

	if othersServe {
		// Ready instances answer meanwhile: this one joins the queue group
		// only once its copy is whole, so that it takes no request it
		// could only refuse.
		s.watchers.Go(s.registerWhenReady)
		return s, nil
	}
	// Alone, it answers at once, if only with a 503 while it loads: an
	// asker hears why rather than "no responders".
	flushCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := s.registerEndpoints(flushCtx); err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// microConfig is the micro service's configuration: its name and
// description, the stats handler, and what micro tells of itself.
func (s *Service) microConfig(version string) micro.Config {
	return micro.Config{
		Name:         wire.ServiceName,
		Version:      version,
		Description:  "Says which module answers each kind of placeholder, what nodes need, have applied and collect, and composes each node's plan.",
		StatsHandler: s.stats,
		DoneHandler: func(micro.Service) {
			// After Stop, or when micro stopped itself on a fatal error.
			s.logger.Info("micro service stopped", "service", wire.ServiceName)
		},
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			// A slow consumer or permission error on a subscription: the
			// service keeps serving, and the operator is told; a flood's
			// drops once per burst.
			if errors.Is(err, nats.ErrSlowConsumer) {
				if c := s.counterOf(err.Subject); c != nil {
					c.slowConsumer.Add(1)
				}
				s.slow.Event(err.Subject)
				return
			}
			s.logger.Error("service subscription error", "subject", err.Subject, "err", err.Description)
		},
	}
}

// probeTimeout bounds the question whether other instances serve.
const probeTimeout = 500 * time.Millisecond

// servedByOthers returns the partitions other instances answer the verbs
// of now, as micro discovery tells within probeTimeout (an instance that
// lists endpoints serves; "" names an unpartitioned one), or sooner once
// they are enough. It asks before this instance adds its own service.
func (s *Service) servedByOthers(ctx context.Context, enough func(served map[string]bool) bool) map[string]bool {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	served := map[string]bool{}
	_ = discover(ctx, s.conn, func(info micro.Info) bool {
		if len(info.Endpoints) == 0 {
			return false
		}
		served[info.Metadata["partition"]] = true
		return enough != nil && enough(served)
	})
	return served
}

// othersServe reports whether other instances answer the verbs, in
// served (servedByOthers): of every partition this instance serves, if it
// serves some. A request to one of them gets an answer, whatever it says,
// rather than "no responders".
func (s *Service) othersServe(served map[string]bool) bool {
	if len(served) == 0 {
		return false
	}
	for _, p := range s.Held() {
		if !served[strconv.Itoa(p)] {
			return false
		}
	}
	return true
}

// registerWhenReady adds the endpoints once the copy is whole, unless Stop
// came first.
func (s *Service) registerWhenReady() {
	if err := s.WaitReady(s.stopping); err != nil {
		return // stopped
	}
	ctx, cancel := context.WithTimeout(s.stopping, 10*time.Second)
	defer cancel()
	if err := s.registerEndpoints(ctx); err != nil {
		if s.stopping.Err() == nil {
			s.logger.Error("adding the service's endpoints failed", "err", err)
		}
		return
	}
	s.logger.Info("the copy is whole: taking requests from the queue group beside the other instances")
}

// registerEndpoints adds the endpoints and returns once the server has their
// subscriptions: a request sent then is answered, if only with a 503.
func (s *Service) registerEndpoints(ctx context.Context) error {
	s.registering.Lock()
	defer s.registering.Unlock()
	if s.unregistered {
		return nil
	}
	for _, ep := range s.endpoints() {
		if s.partitions != nil && ep.namesAsker() {
			continue // in each partition's instance
		}
		if err := ep.register(s, s.micro, nil); err != nil {
			return err
		}
	}
	if s.partitions != nil {
		if err := s.openPartitions(); err != nil {
			return err
		}
		s.watchers.Go(s.weighPartitions)
	}
	s.registered = true
	if err := s.conn.FlushWithContext(ctx); err != nil {
		return fmt.Errorf("register the service's subscriptions: %w", err)
	}
	return nil
}

// WaitReady returns once the copy of every bucket holds the bucket's initial
// values, or ctx's error.
func (s *Service) WaitReady(ctx context.Context) error {
	for _, c := range s.mirror.Copies() {
		select {
		case <-c.Loaded():
		case <-ctx.Done():
			return fmt.Errorf("buckets still loading (%s): %w", strings.Join(s.mirror.Loading(), ", "), ctx.Err())
		}
	}
	return nil
}

// WaitRegistry returns once the copy holds a registry (some instance wrote
// it) at revision atLeast or later, or ctx's error. Until it holds one,
// compose answers 503.
func (s *Service) WaitRegistry(ctx context.Context, atLeast uint64) error {
	if !s.mirror.Registry.WaitFilled(ctx) || !s.mirror.Registry.WaitFor(ctx, atLeast) {
		return fmt.Errorf("the registry is not in the copy yet: %w", ctx.Err())
	}
	return nil
}

// HasRegistry reports whether the copy holds a registry.
func (s *Service) HasRegistry() bool { return !s.mirror.Registry.Empty() }

// Info returns the micro service's discovery information.
func (s *Service) Info() micro.Info { return s.micro.Info() }

// Stats returns the micro service's statistics, as $SRV.STATS reports them.
// In a partitioned mesh, the partitions' instances are folded in
// (wire.FoldPartitions), those stopped by a shut-out too, so that no count
// goes back; the data's counters are the endpoint's, whole.
func (s *Service) Stats() micro.Stats {
	st := s.micro.Stats()
	if s.partitions == nil {
		return st
	}
	// One look under registering: an instance stopped between reading
	// its counts and reading the retired ones would count twice, or not.
	s.registering.Lock()
	partitions := make([]micro.Stats, 0, 2*len(s.partitions)+1)
	for _, pt := range s.partitions {
		for _, svc := range []micro.Service{pt.micro, pt.relay} {
			if svc != nil {
				partitions = append(partitions, svc.Stats())
			}
		}
	}
	retired := micro.Stats{}
	for _, e := range s.retired {
		copied := *e
		retired.Endpoints = append(retired.Endpoints, &copied)
	}
	s.registering.Unlock()
	return wire.FoldPartitions(st, append(partitions, retired))
}

// Stop stops answering: the endpoints' subscriptions are drained, answers in
// progress are sent (those waiting for a revision get a 503), and the
// watchers stop. The connection stays open. Stop returns once everything
// the service started has ended.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		s.registering.Lock()
		s.unregistered = true // no endpoint is added after this
		s.closePartitions()
		s.registering.Unlock()
		if err := s.micro.Stop(); err != nil {
			s.logger.Warn("stopping micro service", "err", err)
		}
		s.closeDoors() // what they let in is answered, or refused as stopping
		s.stop()       // requests waiting for revisions are refused now
		s.gate.Lock()
		s.closed = true
		s.gate.Unlock()
		s.inFlight.Wait()
		close(s.queue)
		s.workers.Wait()
		s.large.close()
		s.watchers.Wait()
		s.slow.Stop()
	})
}

// stopWatchers ends the watchers and workers of a service that never
// served.
func (s *Service) stopWatchers() {
	s.closeDoors()
	s.stop()
	close(s.queue)
	s.workers.Wait()
	s.large.close()
	s.watchers.Wait()
	s.slow.Stop()
}

// counters count what an endpoint's workers send, which micro does not see:
// micro counts requests, and the errors sent before an answer is dispatched.
type counters struct {
	subject      string
	answered     atomic.Uint64 // answers sent
	early        atomic.Uint64 // of those, answers sent while the copy loads (answerEarly)
	answerErrors atomic.Uint64 // errors sent by workers, and answers that could not be sent
	shed         atomic.Uint64 // 503s for requests that waited longer than MaxQueueWait
	queueFull    atomic.Uint64 // 503s for requests that found the queue full
	askerFull    atomic.Uint64 // 503s for requests whose asker held every place it may (places)
	slowConsumer atomic.Uint64 // bursts of requests dropped from the pending buffer
	largeShed    atomic.Uint64 // 503s for large answers their queue had no room for
	// refused are the refusals sent on AnswerConn, which micro does not
	// count in num_errors.
	refused atomic.Uint64
	// refusedReplies are requests left unanswered because their reply
	// subject is not an inbox (Config.ReplyPrefixes).
	refusedReplies atomic.Uint64
	// relayed are requests handed to a partition's holder (relay).
	relayed atomic.Uint64
	// door, on an endpoint whose subject names its asker, lets requests
	// in by asker (handlerOf); set before the endpoint is added.
	door *admission.Door[func(bool)]
}

// counterOf returns the counters of the endpoint on subject, or nil: a
// partition's subject is its endpoint's, the partition's token last.
func (s *Service) counterOf(subject string) *counters {
	for _, c := range s.counters {
		if c.subject == subject {
			return c
		}
	}
	if i := strings.LastIndexByte(subject, '.'); s.partitions != nil && i > 0 {
		return s.counterOf(subject[:i])
	}
	return nil
}

// stats is an endpoint's "data" in $SRV.STATS: a
// provisionerv1.EndpointStatsData, as wire.EncodeStatsData writes it.
func (s *Service) stats(e *micro.Endpoint) any {
	c := s.counters[e.Name]
	data := &provisionerv1.EndpointStatsData{
		Answered:       c.answered.Load(),
		AnsweredEarly:  c.early.Load(),
		AnswerErrors:   c.answerErrors.Load(),
		Shed:           c.shed.Load(),
		QueueFull:      c.queueFull.Load(),
		AskerFull:      c.askerFull.Load(),
		SlowConsumer:   c.slowConsumer.Load(),
		RefusedReplies: c.refusedReplies.Load(),
		LargeShed:      c.largeShed.Load(),
		Refused:        c.refused.Load(),
		Dropped:        c.dropped(),
		DroppedByAsker: c.droppedByAsker(),
		ShutOut:        s.shutOutStats(),
		Relayed:        c.relayed.Load(),
		Held:           uint32s(s.Held()),
		Loading:        s.mirror.Loading(),
		Behind:         s.mirror.Behind(),
		AnswerCache:    s.answers.CacheStats(),
		Plans:          s.plans.Proto(),
	}
	if s.partitionSeats != nil {
		data.PartitionSeats = uint32s(s.partitionSeats())
	}
	for _, x := range s.mirror.OverBudget() {
		data.OverBudget = append(data.OverBudget, &provisionerv1.OverBudget{
			Bucket: x.Bucket, Node: x.Node, Keys: uint64(x.Keys), Bytes: uint64(x.Bytes), Refused: uint64(x.Refused)})
	}
	for _, cp := range s.mirror.Copies() {
		records, malformed, groups, revision := cp.Counts()
		data.Buckets = append(data.Buckets, &provisionerv1.BucketStats{Bucket: cp.Bucket(), Revision: revision,
			Records: uint64(records), Malformed: uint64(malformed), Nodes: uint64(groups)})
	}
	if s.seat != nil {
		held, since, holder := s.seat()
		data.Seat = "standby"
		if held {
			data.Seat = "held"
		}
		data.SeatSince = since.UTC().Format(time.RFC3339)
		data.SeatHolder = holder
	}
	raw, err := wire.EncodeStatsData(data)
	if err != nil {
		s.logger.Error("encoding an endpoint's stats", "endpoint", e.Name, "err", err)
		return nil
	}
	return raw
}

// logBudget logs when a node goes over its budget in a bucket, and when it
// comes back under: each at most once a minute a node, which may go over
// and back as often as it writes.
func (s *Service) logBudget(x mirror.Excess) {
	if x.Over {
		s.warnings.Log(slog.LevelWarn, "over budget", x.Node, "node over its budget: its further keys are not held and are reported as malformed",
			"bucket", x.Bucket, "node", x.Node, "keys_held", x.Keys, "bytes_held", x.Bytes, "keys_refused", x.Refused)
		return
	}
	s.warnings.Log(slog.LevelInfo, "back within budget", x.Node, "node back within its budget", "bucket", x.Bucket, "node", x.Node, "keys_held", x.Keys, "bytes_held", x.Bytes)
}

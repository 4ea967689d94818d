package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// Names under which the service is found on the bus.
const (
	// Name is the micro service's name.
	Name = "mesh-provisioner"
	// ProvisioningEndpoint is the endpoint's name.
	ProvisioningEndpoint = "provisioning"
	// ProvisioningSubject is the subject the endpoint answers.
	ProvisioningSubject = Name + "." + ProvisioningEndpoint
	// ComposeEndpoint is the name of the endpoint that composes a node.
	ComposeEndpoint = "compose"
	// ComposeSubject is the subject it answers.
	ComposeSubject = Name + "." + ComposeEndpoint
)

// Config holds what Start needs.
type Config struct {
	// Conn is the connection the service answers on and watches the
	// buckets through. Required; the caller owns it.
	Conn *nats.Conn
	// Version is the service's semantic version, as micro discovery shows it.
	// Empty means "0.0.0-dev".
	Version string
	// Logger receives the service's logs; nil means slog.Default().
	Logger *slog.Logger
	// Concurrency is how many answers are built at once; zero means twice
	// GOMAXPROCS. Further requests wait in the subscription's pending queue.
	Concurrency int
	// RevisionWait bounds how long a request that asks for a revision the
	// copy has not reached waits before a 503; zero means 5s.
	RevisionWait time.Duration
	// SlowCompose is the duration over which a composition is logged with
	// its phases; zero means 100ms.
	SlowCompose time.Duration
	// MaxWaiting bounds the requests waiting for revisions at once; more
	// are refused with a 503 rather than held. Zero means 1024.
	MaxWaiting int
}

// Defaults of Config.
const (
	DefaultRevisionWait = 5 * time.Second
	DefaultSlowCompose  = 100 * time.Millisecond
	DefaultMaxWaiting   = 1024
)

// Service is a running mesh-provisioner micro service.
type Service struct {
	micro  micro.Service
	conn   *nats.Conn
	mirror *mirror
	logger *slog.Logger

	revisionWait time.Duration
	slowCompose  time.Duration
	compositions compositions

	// stopping is cancelled by Stop: watchers and waiting requests end.
	stopping context.Context
	stop     context.CancelFunc
	watchers sync.WaitGroup
	slots    chan struct{} // a worker each
	waiting  chan struct{} // a request waiting for a revision each

	// gate orders admit against Stop: once closed, nothing is admitted, so
	// answers.Wait sees every request that was.
	gate    sync.RWMutex
	closed  bool
	answers sync.WaitGroup

	counters map[string]*counters // by endpoint name
	stopOnce sync.Once
}

// Start opens the provisioning buckets, starts watching them and adds the
// micro service. It returns once the server has the service's subscriptions,
// without waiting for the copy: until it is loaded (see WaitReady), the
// endpoint answers 503.
func Start(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Conn == nil {
		return nil, errors.New("service: Config.Conn is required")
	}
	if cfg.Version == "" {
		cfg.Version = "0.0.0-dev"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 2 * runtime.GOMAXPROCS(0)
	}
	if cfg.RevisionWait <= 0 {
		cfg.RevisionWait = DefaultRevisionWait
	}
	if cfg.SlowCompose <= 0 {
		cfg.SlowCompose = DefaultSlowCompose
	}
	if cfg.MaxWaiting <= 0 {
		cfg.MaxWaiting = DefaultMaxWaiting
	}
	js, err := jetstream.New(cfg.Conn)
	if err != nil {
		return nil, err
	}
	s := &Service{
		conn:         cfg.Conn,
		mirror:       newMirror(),
		logger:       cfg.Logger,
		slots:        make(chan struct{}, cfg.Concurrency),
		waiting:      make(chan struct{}, cfg.MaxWaiting),
		revisionWait: cfg.RevisionWait,
		slowCompose:  cfg.SlowCompose,
		counters:     map[string]*counters{ProvisioningEndpoint: {}, ComposeEndpoint: {}},
	}

	kvs := make([]jetstream.KeyValue, 0, 4)
	for _, c := range s.mirror.buckets() {
		kv, err := js.KeyValue(ctx, c.name())
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrBucketMissing, c.name())
		}
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", c.name(), err)
		}
		kvs = append(kvs, kv)
	}
	s.stopping, s.stop = context.WithCancel(context.Background())
	for i, c := range s.mirror.buckets() {
		s.watchers.Add(1)
		go func() {
			defer s.watchers.Done()
			s.keepWatching(s.stopping, c, kvs[i])
		}()
	}

	s.micro, err = micro.AddService(cfg.Conn, micro.Config{
		Name:         Name,
		Version:      cfg.Version,
		Description:  "Says which module answers each kind of placeholder, what nodes need, have applied and collect, and composes each node's plan.",
		StatsHandler: s.stats,
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			// A slow consumer or permission error on a subscription: the
			// service keeps serving, and the operator is told.
			s.logger.Error("service subscription error", "subject", err.Subject, "err", err.Description)
		},
	})
	if err != nil {
		s.stop()
		return nil, fmt.Errorf("add micro service: %w", err)
	}
	for _, ep := range []struct {
		name, subject     string
		handler           micro.HandlerFunc
		request, response proto.Message
	}{
		{ProvisioningEndpoint, ProvisioningSubject, s.handleProvisioning, &provisionerv1.ProvisioningRequest{}, &provisionerv1.ProvisioningResponse{}},
		{ComposeEndpoint, ComposeSubject, s.handleCompose, &provisionerv1.ComposeRequest{}, &provisionerv1.ComposeResponse{}},
	} {
		err = s.micro.AddEndpoint(ep.name, ep.handler,
			micro.WithEndpointSubject(ep.subject),
			micro.WithEndpointMetadata(map[string]string{
				"request":       string(ep.request.ProtoReflect().Descriptor().FullName()),
				"response":      string(ep.response.ProtoReflect().Descriptor().FullName()),
				"content_types": ContentTypeProtobuf + ", " + ContentTypeJSON,
			}),
		)
		if err != nil {
			s.Stop()
			return nil, fmt.Errorf("add endpoint %s: %w", ep.name, err)
		}
	}
	// Once Start returns, the server knows the subscriptions: a request sent
	// then is answered, if only with a 503.
	flushCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := cfg.Conn.FlushWithContext(flushCtx); err != nil {
		s.Stop()
		return nil, fmt.Errorf("register the service's subscriptions: %w", err)
	}
	return s, nil
}

// keepWatching runs a bucket's watcher until ctx is done, starting it again,
// after a pause that grows to watchRetryMax, whenever it fails.
func (s *Service) keepWatching(ctx context.Context, c watched, kv jetstream.KeyValue) {
	pause := watchRetryMin
	for {
		started := time.Now()
		err := c.watch(ctx, kv)
		if ctx.Err() != nil {
			return
		}
		if time.Since(started) > watchRetryMax {
			pause = watchRetryMin // it had been running well: not a failure streak
		}
		s.logger.Error("bucket watcher failed; starting it again", "bucket", c.name(), "err", err, "in", pause)
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
		pause = min(2*pause, watchRetryMax)
	}
}

// How long keepWatching pauses before it starts a failed watcher again.
const (
	watchRetryMin = 250 * time.Millisecond
	watchRetryMax = 30 * time.Second
)

// WaitReady returns once the copy of every bucket holds the bucket's initial
// values, or ctx's error.
func (s *Service) WaitReady(ctx context.Context) error {
	ticker := time.NewTicker(10 * time.Millisecond)
	defer ticker.Stop()
	for {
		loading := s.mirror.loading()
		if len(loading) == 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("buckets still loading (%s): %w", strings.Join(loading, ", "), ctx.Err())
		case <-ticker.C:
		}
	}
}

// Info returns the micro service's discovery information.
func (s *Service) Info() micro.Info { return s.micro.Info() }

// Stop stops answering: the endpoints' subscriptions are drained, answers in
// progress are sent (those waiting for a revision get a 503), and the
// watchers stop. The connection stays open.
func (s *Service) Stop() {
	s.stopOnce.Do(func() {
		if err := s.micro.Stop(); err != nil {
			s.logger.Warn("stopping micro service", "err", err)
		}
		s.stop() // requests waiting for revisions are refused now
		s.gate.Lock()
		s.closed = true
		s.gate.Unlock()
		s.answers.Wait()
		s.watchers.Wait()
	})
}

// counters count what an endpoint's workers send, which micro does not see:
// micro counts requests, and the errors sent before an answer is dispatched.
type counters struct {
	answered     atomic.Uint64 // answers sent
	answerErrors atomic.Uint64 // errors sent by workers, and answers that could not be sent
}

// stats is the endpoint's "data" in $SRV.STATS.
func (s *Service) stats(e *micro.Endpoint) any {
	c := s.counters[e.Name]
	return map[string]any{
		"answered":      c.answered.Load(),
		"answer_errors": c.answerErrors.Load(),
		"loading":       append([]string{}, s.mirror.loading()...),
	}
}

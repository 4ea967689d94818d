package mirror

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime/debug"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/backoff"
	"github.com/novox/mesh-provisioner/wire"
)

// ErrBucketMissing is returned by Open when a provisioning bucket does not
// exist; the buckets package creates them.
var ErrBucketMissing = errors.New("provisioning bucket missing")

// ErrWatchGap is why a bucket's watcher is started again when its consumer
// skipped a delivery: the copy resumes from its own revision rather than
// miss a change.
var ErrWatchGap = errors.New("the bucket's consumer skipped a delivery")

// How the watchers follow a bucket. Each bucket is read by an ephemeral,
// unacknowledged pull consumer of its KV stream that starts just after the
// copy's revision. A consumer that is lost (its server restarted or was
// killed, the consumer deleted, the connection moved to another server) is
// noticed by a missed heartbeat, a terminal status or the connection's
// reconnect, and a new one resumes from the copy's revision at once.
const (
	// DefaultHeartbeat is the idle heartbeat of a watcher's pull requests: a
	// consumer that sends none for two of them is taken for lost.
	DefaultHeartbeat = 500 * time.Millisecond
	// readHeartbeat is the idle heartbeat of a consumer that reads the
	// last value of the keys of some partitions and ends with the read (a
	// Hold's, or a copy's first read of its partitions): such a read lost
	// is read again from its start, and nats-server may deliver nothing to
	// a bucket's consumers for a second while it makes another consumer of
	// millions of keys' last values (bench-scale's four instances lost up
	// to a dozen reads so at a 500ms heartbeat). A consumer that follows
	// the bucket live keeps DefaultHeartbeat.
	readHeartbeat = 2 * time.Second
	// apiTimeout bounds each JetStream API request of a watcher (stream
	// info, consumer creation): one sent into an election is given up and
	// sent again rather than waited on for the client's 5s default.
	apiTimeout = time.Second
	// apiPatienceMax is the longest an attempt to read every key's last
	// value (a copy that loads, a Hold's read) waits for its API requests
	// once attempts before it failed (a look at a provider's bucket waits
	// boundLookWait):
	// each failure doubles the next attempt's wait from apiTimeout.
	// nats-server answers its API with as many workers as it has cores, and
	// makes a consumer of every key's last value only once it has listed
	// each key's last message, a second or more for millions of keys on a
	// busy small machine. A request given up still costs the server its
	// work, and sent again it queues behind its earlier copy: bench-scale's
	// four instances gave up 45 to 96 reads so in a run, at the start, and
	// took tens of seconds more to load. An election answers nothing, and
	// each attempt into one costs up to this much, not apiTimeout: at 4 s,
	// a partition's read after its holder and a stream's leader were
	// killed ended 2.7-5.4 s after the election in two fault runs of six.
	apiPatienceMax = 2 * apiTimeout
	// consumerInactive is how long the server keeps a consumer no watcher
	// pulls from.
	consumerInactive = 10 * time.Second
	// How long a watcher pauses before it starts again: jittered by half,
	// doubling from watchRetryMin to watchRetryMax, and cut short by a
	// reconnect.
	watchRetryMin = 50 * time.Millisecond
	watchRetryMax = time.Second
	// pollEvery is how often a copy that is behind asks its bucket for the
	// changes after its revision, one by one with direct gets, while no
	// consumer can be made (a consumer needs JetStream's meta leader; a
	// direct get is answered by any replica).
	pollEvery = 50 * time.Millisecond
	// pullBatch is how many messages a watcher asks for at once: a full
	// read of a large bucket takes fewer round trips.
	pullBatch = 4096
	// smallFirst is how long the large buckets' watchers wait for the
	// registry's and the manifests' copies to load before they start.
	smallFirst = time.Second
)

// Watchers keep a mirror's copies up to date, one consumer per bucket.
type Watchers struct {
	mirror    *Mirror
	conn      *nats.Conn
	js        jetstream.JetStream
	followers []*follower // in the order of Mirror.Copies
	logger    *slog.Logger
	// filling ends the reads of nodes held anew (Hold) when Run returns.
	filling     context.Context
	stopFilling context.CancelFunc
}

// Open binds the five buckets; Run then watches them. A nil logger means
// slog.Default().
func (m *Mirror) Open(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) (*Watchers, error) {
	if logger == nil {
		logger = slog.Default()
	}
	w := &Watchers{mirror: m, conn: js.Conn(), js: js, logger: logger}
	w.filling, w.stopFilling = context.WithCancel(context.Background())
	for _, c := range m.followedCopies() {
		kv, err := js.KeyValue(ctx, c.Bucket())
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			return nil, fmt.Errorf("%w: %s", ErrBucketMissing, c.Bucket())
		}
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", c.Bucket(), err)
		}
		stream, err := js.Stream(ctx, wire.StreamOf(kv.Bucket()))
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", c.Bucket(), err)
		}
		stored, err := wire.StoredKeysOf(kv.Bucket(), stream.CachedInfo().Config.SubjectTransform)
		if err != nil {
			return nil, fmt.Errorf("open bucket %s: %w", c.Bucket(), err)
		}
		f := &follower{
			copy:      c,
			kv:        kv,
			stream:    stream,
			prefix:    wire.KVPrefix(kv.Bucket()),
			stored:    stored,
			heartbeat: DefaultHeartbeat,
			js:        js,
			conn:      w.conn,
			logger:    logger.With("bucket", c.Bucket()),
			kick:      make(chan struct{}, 1),
			wake:      make(chan struct{}, 1),
			following: make(chan struct{}),

			readsDirectFirst: c == followed(m.Registry) || c == followed(m.Manifests),
		}
		if m.isPartial(c) {
			f.held = m.heldNow
		}
		w.followers = append(w.followers, f)
	}
	return w, nil
}

// Run watches every bucket until ctx is done, starting a lost watcher again
// from its copy's revision, and the providers' buckets as they are named
// (Bound.Run); it returns once every watcher has stopped.
func (w *Watchers) Run(ctx context.Context) {
	defer w.stopFilling()
	statuses := w.conn.StatusChanged(nats.RECONNECTING, nats.CONNECTED)
	defer w.conn.RemoveStatusListener(statuses)
	var wg sync.WaitGroup
	wg.Go(func() { w.mirror.Bound.Run(ctx, w.js, w.logger) })
	// The registry and the manifests are read first, and their consumers
	// made, at most smallFirst ahead of the large buckets: a few keys,
	// which an instance alone needs to answer a node before its copy is
	// whole (ReadNode), and which would otherwise share nats-server with
	// the large buckets' delivery. Read by a direct get, a copy is loaded
	// before its consumer is asked for: made after the large buckets'
	// consumers of millions of keys, each a second of nats-server's API,
	// it timed out, and every answer said the registry's copy was behind
	// for 20 s (bench-scale, four instances).
	small := make(chan struct{})
	wg.Go(func() {
		defer close(small)
		wait := time.NewTimer(smallFirst)
		defer wait.Stop()
		for _, f := range w.followers {
			if !f.readsDirectFirst {
				continue
			}
			for _, ready := range []<-chan struct{}{f.copy.Loaded(), f.following} {
				select {
				case <-ready:
				case <-wait.C:
					return
				case <-ctx.Done():
					return
				}
			}
		}
	})
	for _, f := range w.followers {
		if f.held != nil { // the partitions held are set by now (SetHolds)
			if held := f.held(); slices.Contains(held, false) && f.stored.HeldSubjects(held) == nil {
				f.logger.Info("the bucket stores every node's keys together (made before the mesh had partitions, or for a count of them that is no multiple of this one's): the copy reads every key as it loads, and keeps its partitions' alone",
					"stored_partitions", f.stored.Partitions, "partitions", len(held))
			}
		}
		wg.Go(func() {
			if !f.readsDirectFirst {
				<-small
			}
			f.run(ctx)
		})
		wg.Go(func() { f.pollWhileBehind(ctx) })
		wg.Go(func() { f.readmitLoop(ctx) })
		wg.Go(func() { f.auditLoop(ctx) })
	}
	wg.Go(func() { w.releaseLoadMemory(ctx) })
	wg.Go(func() {
		for {
			select {
			case <-ctx.Done():
				return
			case status := <-statuses:
				for _, f := range w.followers {
					f.connectionChanged(status)
				}
			}
		}
	})
	wg.Wait()
}

// releaseLoadMemory gives the memory the first load left free back to the
// system once every copy is loaded: the load's garbage peaks at about twice
// the copy, and the runtime would otherwise keep those pages for minutes.
func (w *Watchers) releaseLoadMemory(ctx context.Context) {
	for _, c := range w.mirror.Copies() {
		select {
		case <-ctx.Done():
			return
		case <-c.Loaded():
		}
	}
	debug.FreeOSMemory()
}

// follower keeps one bucket's copy up to date.
type follower struct {
	copy      followed
	kv        jetstream.KeyValue // the bucket, bound once: a node's keys are read through it (ReadNode)
	stream    jetstream.Stream
	prefix    string          // of the bucket's key subjects: wire.KVPrefix
	stored    wire.StoredKeys // how the bucket stores its keys
	held      func() []bool   // the partitions the copy holds (Mirror.heldNow); nil: every node
	heartbeat time.Duration
	// readsDirectFirst says the copy's first read is one batch direct get
	// (readLastDirect): a bucket of few keys that an instance needs to
	// answer anything, the registry's or the manifests'.
	readsDirectFirst bool
	js               jetstream.JetStream
	conn             *nats.Conn
	logger           *slog.Logger
	kick             chan struct{} // resume now: the connection is back
	wake             chan struct{} // the copy fell behind: poll
	// following is closed once a consumer of the bucket was first made
	// (markFollowing).
	following     chan struct{}
	followingOnce sync.Once

	// applying orders the changes applied by the consumer and by the
	// poller: each is applied once, in revision order.
	applying sync.Mutex

	mu     sync.Mutex
	cancel context.CancelFunc // of the consumer being followed
	// Since when, and from which revision, the copy may lag the bucket;
	// behindSince is zero while it is known to be current.
	behindSince time.Time
	behindFrom  uint64
	// reloading is set during a full read, whose end drops the keys it did
	// not deliver: the poller stands aside, lest a key it applies after the
	// read began be dropped.
	reloading bool
	// lost says the bucket lost messages the copy holds (a purge): the next
	// consumer reads every key again, whatever the revisions say.
	lost bool
	// followOn is set by the end of a read of the partitions held alone:
	// the next consumer starts after it without asking the stream's state,
	// one JetStream API request fewer when many copies load at once.
	followOn *uint64

	// fill is the read of the keys of nodes the copy holds anew
	// (Watchers.Hold), while it lasts; guarded by applying.
	fill *fill
}

// markFollowing says a consumer of the bucket was made.
func (f *follower) markFollowing() { f.followingOnce.Do(func() { close(f.following) }) }

// connectionChanged ends the consumer being followed when the connection is
// lost or comes back: a consumer on the server left may be gone, and the
// one that replaces it resumes from the copy's revision at once.
func (f *follower) connectionChanged(status nats.Status) {
	if status == nats.RECONNECTING {
		f.fellBehind("the connection to NATS was lost")
	}
	f.mu.Lock()
	if f.cancel != nil {
		f.cancel()
	}
	f.mu.Unlock()
	if status == nats.CONNECTED {
		for _, ch := range []chan struct{}{f.kick, f.wake} {
			select {
			case ch <- struct{}{}:
			default:
			}
		}
	}
}

// run follows the bucket until ctx is done.
func (f *follower) run(ctx context.Context) {
	retry := backoff.New(backoff.Config{Min: watchRetryMin, Max: watchRetryMax, Factor: 2, Jitter: 0.5})
	patience := newAPIPatience()
	loadFailed := false // logged once
	for {
		attempt, cancel := context.WithCancel(ctx)
		f.mu.Lock()
		f.cancel = cancel
		f.mu.Unlock()
		var err error
		if f.conn.IsConnected() {
			// A copy that loads reads every key's last value; one that
			// resumes asks for a consumer that costs the server little,
			// and one not answered in time was sent into an election.
			timeout := apiTimeout
			if !f.copy.Ready() {
				timeout = patience.Next()
			}
			err = f.follow(attempt, timeout)
		}
		cancel()
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errReadEnded) {
			retry.Reset()
			continue
		}
		if errors.Is(err, errFollowed) {
			retry.Reset() // it had caught up: not a failure streak
		}
		var wait <-chan time.Time
		var pause time.Duration // none while disconnected: only the reconnect (a kick) resumes it
		if f.conn.IsConnected() {
			pause = retry.Next()
			wait = time.After(pause)
		}
		switch {
		case err == nil:
		case !f.copy.Ready():
			if !loadFailed {
				f.logger.Warn("bucket watcher failed while loading the copy; trying again", "err", err)
				loadFailed = true
			}
		default:
			f.fellBehind(err.Error())
			f.logger.Debug("bucket watcher stopped; resuming", "err", err, "in", pause)
		}
		select {
		case <-ctx.Done():
			return
		case <-f.kick:
			retry.Reset()
			patience.Reset()
		case <-wait:
		}
	}
}

// newAPIPatience returns how long each attempt of a retry loop waits for
// its JetStream API requests: apiTimeout, doubled by each attempt after
// one that failed, up to apiPatienceMax, until Reset.
func newAPIPatience() *backoff.Backoff {
	return backoff.New(backoff.Config{Min: apiTimeout, Max: apiPatienceMax, Factor: 2})
}

// errFollowed wraps why a watcher that had caught up with its bucket
// stopped.
var errFollowed = errors.New("after catching up")

// errReadEnded ends a read of every key's last value that is not a
// consumer that follows on (the partitions held alone, or a bucket's
// first read by a batch direct get): the watcher goes on at once with a
// consumer of every change after it (followOn).
var errReadEnded = errors.New("every key's last value was read")

// fellBehind records that the copy may lag the bucket from now on, and logs
// it once.
func (f *follower) fellBehind(why string) {
	if !f.copy.Ready() {
		return // still loading: every answer is a 503 anyway
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.behindSince.IsZero() {
		return
	}
	f.behindSince = time.Now()
	f.behindFrom = f.copy.Revision()
	f.copy.setBehind(true)
	select {
	case f.wake <- struct{}{}:
	default:
	}
	f.logger.Warn("bucket copy may be behind: its watcher was lost; resuming from the copy's revision",
		"reason", why, "revision", f.behindFrom)
}

// caughtUp records that the copy holds every change of the bucket up to
// revision, its last when the consumer was created or later.
func (f *follower) caughtUp(revision uint64) {
	f.copy.MarkLoaded()
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.behindSince.IsZero() {
		return
	}
	f.copy.setBehind(false)
	f.logger.Info("bucket copy caught up",
		"behind_for", time.Since(f.behindSince).Round(time.Millisecond),
		"from_revision", f.behindFrom, "to_revision", revision, "revisions_behind", revision-min(revision, f.behindFrom))
	f.behindSince = time.Time{}
}

// follow creates a consumer that starts just after the copy's revision and
// applies what it delivers until ctx is done or the consumer is lost. The
// first time, and when the bucket no longer holds the changes after the
// copy's revision (purged, or removed by limits), it reads every key's last
// value instead and drops the keys it does not deliver. Its API requests
// are given up after timeout.
func (f *follower) follow(ctx context.Context, timeout time.Duration) error {
	if f.readsDirectFirst && f.copy.Revision() == 0 && !f.copy.Ready() {
		directCtx, cancel := context.WithTimeout(ctx, apiTimeout)
		err := f.readLastDirect(directCtx)
		cancel()
		if err == nil {
			return errReadEnded
		}
		// Too many keys or bytes for one batch, a replica behind the one
		// that answered first, or no answer (a stream that answers no
		// direct get, or an identity not granted it).
		f.logger.Debug("the bucket's first read is not one batch direct get; reading it through a consumer", "err", err)
	}
	apiCtx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	run, cfg, err := f.plan(apiCtx)
	if err != nil {
		return err
	}
	if run.reload {
		f.setReloading(true)
		defer f.setReloading(false)
	}
	consumer, err := f.createConsumer(apiCtx, cfg)
	if err != nil {
		return fmt.Errorf("create the bucket's consumer: %w", err)
	}
	f.markFollowing()
	if run.partitions {
		defer f.deleteConsumer(ctx, consumer) // it sees the partitions held alone
	}
	if f.copy.Ready() {
		f.logger.Debug("bucket watcher resuming", "from_revision", run.revision+1,
			"bucket_last_revision", run.lastSeq, "pending", consumer.CachedInfo().NumPending)
	}
	if consumer.CachedInfo().NumPending == 0 {
		if run.stateUnread { // no key to end the read with: the stream's last revision does
			info, err := f.stream.Info(apiCtx)
			if err != nil {
				return fmt.Errorf("read the bucket's stream state: %w", err)
			}
			run.lastSeq = info.State.LastSeq
		}
		run.catchUp(max(run.revision, run.lastSeq))
	}
	if run.partitions && run.caught {
		return errReadEnded
	}
	heartbeat := f.heartbeat
	if run.partitions {
		heartbeat = readHeartbeat // it ends with the read
	}
	messages, err := consumer.Messages(
		jetstream.PullHeartbeat(heartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true),
		jetstream.PullMaxMessages(pullBatch),
	)
	if err != nil {
		return fmt.Errorf("pull from the bucket's consumer: %w", err)
	}
	defer messages.Stop()
	stop := context.AfterFunc(ctx, messages.Stop)
	defer stop()
	// A full read is applied by a goroutine of its own, beside the one that
	// reads the consumer: keys come once each in a full read, so their order
	// does not matter until it is over, and a large bucket loads on two
	// cores rather than one.
	if run.reload && !run.caught {
		run.loading = newLoader(f, run.applyAll)
		defer run.finishLoading()
	}
	for {
		msg, err := messages.Next()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if run.caught {
				err = fmt.Errorf("%w: %w", errFollowed, err)
			}
			return fmt.Errorf("the bucket's consumer was lost: %w", err)
		}
		if err := run.deliver(msg); err != nil {
			return err
		}
		if run.partitions && run.caught {
			return errReadEnded
		}
	}
}

// followRun is one consumer's run: where it starts, and how far it got.
type followRun struct {
	f                 *follower
	revision, lastSeq uint64 // the copy's at the start, and the stream's
	// reload says every key's last value is read, not the changes after
	// revision; live then collects the keys delivered, and the read's end
	// drops the others (nil for an empty copy, which has nothing to drop).
	reload bool
	live   map[string]bool
	// held is the partitions a full read reads (nil: every node), and
	// partitions says it reads them alone (wire.StoredKeys): its consumer,
	// which sees no other partition's changes, ends with the read
	// (errReadEnded), and one of every key's changes follows.
	held       []bool
	partitions bool
	// applyAll applies every change though the copy's revision cannot go
	// back: the bucket was deleted and made again, its revisions over.
	applyAll bool
	// stateUnread says lastSeq was not read: a copy's first read of a
	// bucket it holds whole ends with the last key delivered, and needs
	// the stream's state only when there is none (plan).
	stateUnread bool
	loading     *loader // applies a full read's changes, while it lasts
	delivered   uint64  // the consumer's last delivery
	read        int     // messages delivered
	caught      bool    // the copy reached the stream's last revision
}

// plan reads the stream's state and says how the copy follows it: the
// changes after its revision, or, when the bucket no longer holds them (or
// the copy has not loaded, or lost messages it held), every key's last
// value.
func (f *follower) plan(ctx context.Context) (*followRun, jetstream.ConsumerConfig, error) {
	f.mu.Lock()
	after := f.followOn
	f.followOn = nil
	f.mu.Unlock()
	if after != nil {
		cfg := f.lastValues(nil)
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = *after + 1
		return &followRun{f: f, revision: *after, lastSeq: *after}, cfg, nil
	}
	revision := f.copy.Revision()
	if revision == 0 && !f.copy.Ready() {
		// A first read of every key's last value, but of some partitions
		// (which follow on from the stream's last revision): nothing of the
		// stream's state decides it. nats-server answers stream infos only
		// when no other API request waits for its workers: while instances
		// loaded a large mesh, the registry's and the manifests' first
		// reads, which an instance needs to answer anything, waited seconds
		// for theirs.
		var held []bool
		if f.held != nil {
			held = f.held()
		}
		if cfg := f.lastValues(held); len(cfg.FilterSubjects) == 0 {
			run := &followRun{f: f, reload: true, stateUnread: true, held: held}
			if !f.copy.Empty() {
				run.live = map[string]bool{}
			}
			return run, cfg, nil
		}
	}
	info, err := f.stream.Info(ctx)
	if err != nil {
		return nil, jetstream.ConsumerConfig{}, fmt.Errorf("read the bucket's stream state: %w", err)
	}
	state := info.State
	run := &followRun{f: f, revision: revision, lastSeq: state.LastSeq, applyAll: revision > state.LastSeq}
	run.reload = !f.copy.Ready() || state.FirstSeq > revision+1 || revision > state.LastSeq || f.lostMessages()
	if !run.reload {
		cfg := f.lastValues(nil)
		cfg.DeliverPolicy = jetstream.DeliverByStartSequencePolicy
		cfg.OptStartSeq = revision + 1
		return run, cfg, nil
	}
	if f.held != nil {
		run.held = f.held()
	}
	cfg := f.lastValues(run.held)
	run.partitions = len(cfg.FilterSubjects) > 0
	if !f.copy.Empty() {
		run.live = map[string]bool{}
	}
	if f.copy.Ready() {
		f.logger.Warn("the bucket no longer holds every change after the copy's revision; reading every key again",
			"revision", revision, "bucket_first_revision", state.FirstSeq, "bucket_last_revision", state.LastSeq)
	}
	return run, cfg, nil
}

// createConsumer creates a consumer of the bucket's stream, and logs how
// long nats-server took to make it.
func (f *follower) createConsumer(ctx context.Context, cfg jetstream.ConsumerConfig) (jetstream.Consumer, error) {
	asked := time.Now()
	consumer, err := f.stream.CreateConsumer(ctx, cfg)
	if err == nil {
		f.logger.Debug("bucket consumer made", "took", time.Since(asked).Round(time.Millisecond),
			"last_values", cfg.DeliverPolicy == jetstream.DeliverLastPerSubjectPolicy, "pending", consumer.CachedInfo().NumPending)
	}
	return consumer, err
}

// lastValues returns the configuration of a consumer of the last value of
// each key of the nodes in the partitions held (nil for every node), read
// alone where the bucket stores keys by partition.
func (f *follower) lastValues(held []bool) jetstream.ConsumerConfig {
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: consumerInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	if cfg.FilterSubjects = f.stored.HeldSubjects(held); cfg.FilterSubjects == nil {
		cfg.FilterSubject = f.prefix + ">"
	}
	return cfg
}

// deliver applies one message of the consumer, and marks the copy caught up
// once it is the stream's last.
func (r *followRun) deliver(msg jetstream.Msg) error {
	meta, err := msg.Metadata()
	if err != nil {
		return fmt.Errorf("a message of the bucket's consumer: %w", err)
	}
	if meta.Sequence.Consumer != r.delivered+1 {
		return fmt.Errorf("%w: delivery %d after %d", ErrWatchGap, meta.Sequence.Consumer, r.delivered)
	}
	r.delivered = meta.Sequence.Consumer
	r.read++
	key, ok := r.f.stored.Key(msg.Subject())
	if !ok {
		return nil
	}
	deleted := wire.KVRemoves(msg.Headers())
	if r.live != nil && !deleted {
		r.live[key] = true
	}
	if r.loading != nil {
		r.loading.add(change{key, msg.Data(), meta.Sequence.Stream, deleted})
	} else {
		r.f.apply(key, msg.Data(), meta.Sequence.Stream, deleted, r.applyAll)
	}
	if !r.caught && meta.NumPending == 0 {
		r.catchUp(meta.Sequence.Stream)
	}
	return nil
}

// catchUp ends a full read, if one is under way (its loader finished, the
// keys it did not deliver dropped), and marks the copy caught up at
// revision.
func (r *followRun) catchUp(revision uint64) {
	r.finishLoading()
	if r.live != nil {
		var read func(string) bool // every node
		if r.held != nil {
			read = holdsOf(r.held) // a partition taken on meanwhile is its Hold's
		}
		r.f.keepOnly(r.live, read)
		r.live = nil
		r.f.setReloading(false)
	}
	if r.partitions {
		// The copy holds its nodes' every change up to the stream's last
		// revision when the read began, or the read's last, if later.
		revision = max(revision, r.lastSeq)
		r.f.copy.advance(revision)
		r.f.mu.Lock()
		r.f.followOn = &revision
		r.f.mu.Unlock()
	}
	if r.reload {
		r.f.logger.Debug("read every key's last value", "messages", r.read, "partitions_alone", r.partitions, "revision", revision)
	}
	r.f.caughtUp(revision)
	r.caught = true
}

// finishLoading waits for the loader, if any, to apply what it was given.
func (r *followRun) finishLoading() {
	if r.loading != nil {
		r.loading.finish()
		r.loading = nil
	}
}

// change is one message of a bucket, to apply to its copy.
type change struct {
	key      string
	value    []byte
	revision uint64
	deleted  bool
}

// loader applies a full read's changes on a goroutine of its own, in
// batches.
type loader struct {
	batch   []change
	batches chan []change
	done    chan struct{}
	once    sync.Once
}

// loadBatch is how many changes go to the loader at once.
const loadBatch = 256

func newLoader(f *follower, applyAll bool) *loader {
	l := &loader{batches: make(chan []change, 16), done: make(chan struct{})}
	go func() {
		defer close(l.done)
		for batch := range l.batches {
			for _, c := range batch {
				f.apply(c.key, c.value, c.revision, c.deleted, applyAll)
			}
		}
	}()
	return l
}

func (l *loader) add(c change) {
	l.batch = append(l.batch, c)
	if len(l.batch) == loadBatch {
		l.batches <- l.batch
		l.batch = make([]change, 0, loadBatch)
	}
}

// finish applies what is left and returns once every change is applied.
func (l *loader) finish() {
	l.once.Do(func() {
		if len(l.batch) > 0 {
			l.batches <- l.batch
		}
		close(l.batches)
		<-l.done
	})
}

// apply takes one change into the copy, unless the copy already holds it:
// a resumed consumer starts after the copy's revision, but the poller may
// have applied some of what it delivers, and a full read delivers what the
// copy holds. applyAll applies it whatever its revision.
func (f *follower) apply(key string, value []byte, revision uint64, deleted, applyAll bool) {
	f.applying.Lock()
	defer f.applying.Unlock()
	f.fill.saw(key, revision)
	if applyAll || revision > f.copy.Revision() {
		f.copy.Apply(key, value, revision, deleted)
	}
}

// keepOnly ends a full read: the keys it did not deliver, of the nodes it
// read (nil: every node), are dropped.
func (f *follower) keepOnly(live map[string]bool, read func(node string) bool) {
	f.applying.Lock()
	defer f.applying.Unlock()
	f.copy.keepOnly(live, read)
	f.mu.Lock()
	f.lost = false
	f.mu.Unlock()
}

// lostMessages reports whether the bucket lost messages the copy holds.
func (f *follower) lostMessages() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.lost
}

func (f *follower) setReloading(reloading bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reloading = reloading
}

// state reports whether the copy may lag the bucket, and whether a full
// read is in progress.
func (f *follower) state() (behind, reloading bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return !f.behindSince.IsZero(), f.reloading
}

// pollWhileBehind keeps a copy that is behind fresh while its consumer is
// being made again: every pollEvery it asks the bucket, by direct gets, for
// each change after the copy's revision. It does not end the copy's being
// behind; only a consumer that has caught up does.
func (f *follower) pollWhileBehind(ctx context.Context) {
	for {
		behind, reloading := f.state()
		var wait <-chan time.Time
		switch {
		case !behind:
			// Idle until the copy falls behind.
		case reloading || !f.conn.IsConnected():
			wait = time.After(pollEvery) // look again shortly
		default:
			f.pollOnce(ctx)
			wait = time.After(pollEvery)
		}
		select {
		case <-ctx.Done():
			return
		case <-f.wake:
		case <-wait:
		}
	}
}

// pollOnce applies every change after the copy's revision that a direct get
// returns, until none is left or the copy is no longer behind.
func (f *follower) pollOnce(ctx context.Context) {
	for ctx.Err() == nil {
		if behind, reloading := f.state(); !behind || reloading {
			return
		}
		getCtx, cancel := context.WithTimeout(ctx, apiTimeout)
		msg, err := f.stream.GetMsg(getCtx, f.copy.Revision()+1, jetstream.WithGetMsgSubject(f.prefix+">"))
		cancel()
		if err != nil {
			if !errors.Is(err, jetstream.ErrMsgNotFound) {
				f.logger.Debug("reading the bucket's changes by direct get failed", "err", err)
			}
			return // nothing more for now, or no answer
		}
		if key, ok := f.stored.Key(msg.Subject); ok {
			f.apply(key, msg.Data, msg.Sequence, wire.KVRemoves(msg.Header), false)
		}
	}
}

// readmitEvery spaces the reads of nodes back under their budget: a node
// that deletes its keys one by one is read again once a period, not once a
// delete.
const readmitEvery = 250 * time.Millisecond

// readmitLoop reads again the keys not held of each node that made room
// under its budget, so that they are held as if they had just been written.
func (f *follower) readmitLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-f.copy.readmits():
		}
		for _, node := range f.copy.takeReadmits() {
			if err := f.readmit(ctx, node); err != nil && ctx.Err() == nil {
				f.logger.Warn("reading again the keys of a node back within its budget failed; its keys not held wait for its next change", "node", node, "err", err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(readmitEvery):
		}
	}
}

// readmit reads the last value of each key of node, and applies those the
// copy does not hold because of the budget, each only if the copy still
// has it at the revision read: a later change is the watcher's to apply.
func (f *follower) readmit(ctx context.Context, node string) error {
	ctx, cancel := context.WithTimeout(ctx, 10*apiTimeout)
	defer cancel()
	consumer, err := f.stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
		FilterSubjects: []string{f.prefix + node, f.stored.NodePrefix(node) + ">"},
		DeliverPolicy:  jetstream.DeliverLastPerSubjectPolicy,
	})
	if err != nil {
		return err
	}
	admitted := 0
	for {
		batch, err := consumer.Fetch(pullBatch, jetstream.FetchMaxWait(apiTimeout))
		if err != nil {
			return err
		}
		last := true
		for msg := range batch.Messages() {
			meta, err := msg.Metadata()
			if err != nil {
				return err
			}
			last = meta.NumPending == 0
			key, ok := f.stored.Key(msg.Subject())
			if ok && !wire.KVRemoves(msg.Headers()) && f.readmitKey(key, msg.Data(), meta.Sequence.Stream) {
				admitted++
			}
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return err
		}
		if last {
			f.logger.Debug("read again the keys of a node back within its budget", "node", node, "admitted", admitted)
			return nil
		}
	}
}

// readmitKey applies a value read again if the copy holds its key, not
// held, at that value's revision.
func (f *follower) readmitKey(key string, value []byte, revision uint64) bool {
	f.applying.Lock()
	defer f.applying.Unlock()
	if at, ok := f.copy.notHeld(key); !ok || at != revision {
		return false
	}
	f.copy.Apply(key, value, revision, false)
	_, still := f.copy.notHeld(key)
	return !still
}

// auditEvery is how often a follower checks that its bucket still holds
// what its copy holds, and that its watcher delivers.
const auditEvery = time.Second

// stallAfter is how long a copy behind its bucket may take in nothing
// before its watcher is taken for stalled: a consumer that delivers
// nothing while its heartbeats still come (paused, or a delivery lost
// without a gap nats.go sees) is otherwise followed for good.
const stallAfter = 3 * time.Second

// auditLoop notices that the bucket lost messages the copy holds (a purge
// by an operator, messages removed by limits), which no consumer delivers:
// the copy is then behind, and a new consumer reads every key again. It
// notices too a watcher that stalled: a new one resumes from the copy's
// revision.
func (f *follower) auditLoop(ctx context.Context) {
	tick := time.NewTicker(auditEvery)
	defer tick.Stop()
	var moved stallWatch
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if behind, _ := f.state(); behind || !f.copy.Ready() || !f.conn.IsConnected() {
			moved = stallWatch{}
			continue
		}
		// The copy's revision first: the bucket's, read after, is at
		// least as new.
		keys, oldest, revision := f.copy.liveKeys()
		apiCtx, cancel := context.WithTimeout(ctx, apiTimeout)
		info, err := f.stream.Info(apiCtx)
		cancel()
		if err != nil {
			continue // the consumer notices a bucket that is gone
		}
		lost := true
		why := purged(info.State, keys, oldest, revision)
		if why == "" {
			lost, why = false, f.stalled(ctx, &moved, revision, info.State.LastSeq)
		}
		if why == "" {
			continue
		}
		f.mu.Lock()
		f.lost = f.lost || lost
		f.mu.Unlock()
		f.fellBehind(why)
		f.mu.Lock()
		if f.cancel != nil {
			f.cancel() // the next consumer resumes, or reads every key again
		}
		f.mu.Unlock()
	}
}

// stallWatch is when a follower's copy last moved, and to which revision.
type stallWatch struct {
	revision uint64
	since    time.Time
}

// stalled says why the watcher stalled, or "": the copy has taken in
// nothing for stallAfter while behind its bucket (at revision last), and
// the bucket holds a change after the copy's revision, which the watcher
// should have delivered (a last message removed unread is no change).
func (f *follower) stalled(ctx context.Context, moved *stallWatch, revision, last uint64) string {
	now := time.Now()
	if revision != moved.revision || moved.since.IsZero() || revision >= last {
		*moved = stallWatch{revision: revision, since: now}
		return ""
	}
	if still := now.Sub(moved.since); still < stallAfter {
		return ""
	}
	moved.since = now // asked again no sooner than stallAfter
	getCtx, cancel := context.WithTimeout(ctx, apiTimeout)
	msg, err := f.stream.GetMsg(getCtx, revision+1, jetstream.WithGetMsgSubject(f.prefix+">"))
	cancel()
	if err != nil {
		return "" // nothing after the copy's revision, or no answer
	}
	return fmt.Sprintf("its watcher stalled: the copy took in nothing for %s while the bucket holds revision %d after the copy's %d", stallAfter, msg.Sequence, revision)
}

// purged says why the bucket no longer holds what the copy holds, or "".
// Each key the copy holds is a message of the bucket at the copy's
// revision, and later changes never lower the count (a delete's marker
// replaces its key's value): fewer messages than keys, or, while the copy
// is at the stream's last revision, a first message after a key's, mean
// messages were removed. The copy's keys are read before the stream's
// state, which is thus at least as new.
func purged(state jetstream.StreamState, keys int, oldest, revision uint64) string {
	switch {
	case keys == 0:
		return ""
	case state.Msgs < uint64(keys):
		return fmt.Sprintf("the bucket holds %d messages, fewer than the %d keys of the copy: it was purged", state.Msgs, keys)
	case oldest > 0 && state.LastSeq == revision && state.FirstSeq > oldest:
		return fmt.Sprintf("the bucket's first message is at revision %d, after the copy's key at %d: it was purged", state.FirstSeq, oldest)
	}
	return ""
}

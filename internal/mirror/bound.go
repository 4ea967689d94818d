package mirror

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/time/rate"

	"github.com/novox/mesh-provisioner/internal/observe/ratelog"
	"github.com/novox/mesh-provisioner/wire"
)

// How the providers' buckets are found and followed.
const (
	// boundRetry is how often a provider's bucket that does not exist yet
	// is looked for again: until then its provisions are pending.
	boundRetry = 2 * time.Second
	// boundLookups a second, after a burst of boundLookupBurst, bound the
	// looks for buckets not followed yet, across every bucket named (each
	// one JetStream API request, a consumer). A need names its
	// provider, and so a bucket: without the bound, a node naming a
	// provider in each of its thousands of keys would have the server ask
	// about each missing bucket every boundRetry, for as long as it holds
	// them. A mesh names far fewer buckets than the burst.
	boundLookups     = 100
	boundLookupBurst = 1000
	// boundForget is how long a bucket not followed (missing, or that
	// cannot be read) is kept once nothing names it: a node may name any
	// provider, and the copy would otherwise keep every bucket ever named.
	// Such a bucket holds no goroutine meanwhile (Run).
	boundForget = 10 * time.Minute
	// boundCheck is how many boundRetry a followed bucket is checked
	// after, for whether it was deleted (or made again): a watcher does
	// not say.
	boundCheck = 15
	// boundLookWait is how long a look at a bucket waits for its consumer.
	// Answers wait for it no longer than apiTimeout: past that, the bucket
	// reads as failing (its provisions pending, answers say it is behind),
	// as after a look that failed, while the look goes on. nats-server
	// makes consumers in turn with as many workers as it has cores: while
	// instances load a large mesh, each of theirs takes a second. A look
	// given up after a second or two was answered all the same, and the
	// next queued behind it: four instances starting on 100,000 nodes said
	// two buckets behind in a node's answers for 20 s (bench-scale).
	boundLookWait = 5 * time.Second
)

// Bound is the watched copy of the providers' buckets (<provider>_bound):
// the keys each holds and their revisions, never their values, which may
// be a provider's secrets (its watchers ask for headers only). A bucket is
// followed from the first time a composition (or a wait) names it: the set
// of buckets follows the registry and the needs. Until a bucket's keys are
// in, the copy says it is behind; a bucket that does not exist yet holds
// nothing, and every provision of it is pending.
type Bound struct {
	mu      sync.RWMutex
	buckets map[string]*BoundBucket
	// gen counts every change of any bucket (a key, a bucket named, found,
	// loaded or read whole again): answers that read the copy are stamped
	// with it (Stamp), or with the part of it a node's reads see
	// (StampOf).
	gen atomic.Uint64
	// changed is the generation at which keys whose first token is the
	// map's key last changed, in any bucket (Changed, StampOf); shared,
	// the generation of the last change of a bucket as a whole, which any
	// node's reads may see.
	changedMu sync.RWMutex
	changed   map[string]uint64
	shared    uint64
	// isNode, if set, says whether a first token is a node with needs:
	// only those are remembered in changed. A provider may write keys of
	// any first tokens, and the copy would otherwise remember each for
	// good; a first token with no needs has no composition that reads a
	// provider's key, and its first need changes its stamps anyway.
	isNode func(first string) bool
	wants  chan *BoundBucket // buckets named and not yet followed
	// lookups bounds how often buckets are looked for (boundLookups).
	lookups *rate.Limiter
	// retry and forget are boundRetry and boundForget, but in tests.
	retry, forget time.Duration
	// now is the time (Unix nanoseconds) of Run's last tick, every retry:
	// a bucket keeps when a read last named it by this clock, an atomic
	// read a name where time.Now would read the system's clock.
	now atomic.Int64
	// held says the copy is all there is (a capture's): a bucket it lacks
	// holds nothing, and is not followed.
	held bool
	// forgotten counts Run's looks that forgot buckets (Forgotten).
	forgotten atomic.Uint64
	// maxKeys is the most keys the copy holds of one bucket (SetMaxKeys);
	// zero, no limit.
	maxKeys int
}

// ErrTooManyKeys says a provider's bucket holds more keys than the copy
// holds of one (Bound.SetMaxKeys): it is not followed, and reads as
// failing, until it holds fewer.
var ErrTooManyKeys = errors.New("the bucket holds more keys than the server holds of one provider's bucket (service.Config.ProviderMaxKeys, serve --provider-max-keys)")

// SetMaxKeys sets, before Run, the most keys the copy holds of one
// provider's bucket; zero or less, no limit. A provider writes its bucket
// as it likes: without a bound, every instance would hold every key it
// writes.
func (b *Bound) SetMaxKeys(n int) { b.maxKeys = max(n, 0) }

// NewBound returns an empty copy of the providers' buckets.
func NewBound() *Bound {
	b := &Bound{buckets: map[string]*BoundBucket{}, wants: make(chan *BoundBucket, 1024), changed: map[string]uint64{},
		lookups: rate.NewLimiter(boundLookups, boundLookupBurst), retry: boundRetry, forget: boundForget}
	b.now.Store(time.Now().UnixNano())
	return b
}

// BoundBucket is the copy of one provider's bucket.
type BoundBucket struct {
	bound  *Bound
	bucket string

	mu       sync.RWMutex
	keys     map[string]uint64 // key → revision of its last put
	revision uint64
	// loaded: the bucket's keys are in, or it is known not to exist (yet),
	// or it could not be read (failing): its provisions are pending.
	loaded   bool
	failing  bool
	advanced chan struct{} // closed and replaced when revision or loaded moves
	// namedAt is Bound.now when a read last named the bucket (Bucket).
	namedAt atomic.Int64
	// Only Run reads and writes these: running says a goroutine looks for
	// the bucket or follows it, and again that it was asked to look while
	// it ran; next is when a bucket not running is looked for again (zero:
	// at once).
	running, again bool
	next           time.Time
	// warned says the last look's failure was logged: once a run of
	// failures, not every retry; tooMany that the bucket held too many
	// keys, looked for again less often. Only the looking goroutine, one
	// at a time, reads and writes them (and Run once it ended).
	warned, tooMany bool
	// looks counts the looks begun, settled is the count at the last look
	// that read the keys (replace) or found the bucket missing: a look
	// slow to do either marks the bucket failing meanwhile, unless it
	// did (failUnsettled). Guarded by mu.
	looks, settled uint64
	// changedAt is Bound.gen at the bucket's last change (Changed);
	// guarded by Bound.changedMu.
	changedAt uint64
}

// SetTimings replaces, before Run, how often a bucket found missing is
// looked for again (boundRetry) and how long one that nothing names is
// kept (boundForget); zero leaves one as it is. Tests shorten them.
func (b *Bound) SetTimings(retry, forget time.Duration) {
	b.retry, b.forget = cmp.Or(retry, b.retry), cmp.Or(forget, b.forget)
}

// Bucket returns the copy of bucket, which it starts following if it does
// not yet.
func (b *Bound) Bucket(bucket string) *BoundBucket {
	b.mu.RLock()
	bb := b.buckets[bucket]
	if bb != nil {
		// Under the lock, which forgetting takes to write: a bucket named
		// is not forgotten while its reader holds it.
		bb.named()
	}
	b.mu.RUnlock()
	if bb != nil {
		return bb
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if bb = b.buckets[bucket]; bb == nil {
		bb = &BoundBucket{bound: b, bucket: bucket, keys: map[string]uint64{}, advanced: make(chan struct{}), loaded: b.held}
		bb.named()
		b.buckets[bucket] = bb
		b.mark(bb, true)
		select {
		case b.wants <- bb:
		default:
			// Run finds it in the map on its next look.
		}
	}
	return bb
}

// named records that a read named the bucket now, by Run's clock.
func (bb *BoundBucket) named() {
	if now := bb.bound.now.Load(); bb.namedAt.Load() != now {
		bb.namedAt.Store(now)
	}
}

// forgetUnnamed forgets bb, a bucket not running, if nothing named it for
// b.forget; it reports whether it did. A read that names it again makes it
// anew, looked for at once.
func (b *Bound) forgetUnnamed(bb *BoundBucket) bool {
	unnamed := func() bool { return b.now.Load()-bb.namedAt.Load() > int64(b.forget) }
	if !unnamed() {
		return false // the rule: no write lock for a bucket still named
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if !unnamed() || b.buckets[bb.bucket] != bb {
		return false
	}
	delete(b.buckets, bb.bucket)
	return true
}

// Forgotten changes whenever the copy forgets buckets, at most once every
// boundRetry: a reader that named buckets before it changed names them
// again, since a bucket forgotten is followed again only once named.
func (b *Bound) Forgotten() uint64 { return b.forgotten.Load() }

// Key returns the revision of key in bucket, zero when the copy does not
// hold it.
func (b *Bound) Key(bucket, key string) uint64 {
	bb := b.Bucket(bucket)
	bb.mu.RLock()
	defer bb.mu.RUnlock()
	return bb.keys[key]
}

// Stamp changes whenever any bucket of the copy does.
func (b *Bound) Stamp() uint64 { return b.gen.Load() }

// StampOf changes whenever a key whose first token is first changes in any
// bucket while first is a node with needs, and whenever a bucket as a whole
// does (named, found, loaded, failing, read whole again): what a node's
// composition reads of the copy, since the keys it reads begin with the
// node (the registry's rule for the providers' buckets). Read it before
// the keys.
func (b *Bound) StampOf(first string) uint64 {
	b.changedMu.RLock()
	defer b.changedMu.RUnlock()
	return max(b.shared, b.changed[first])
}

// Revisions returns the revision of each bucket followed that holds any.
func (b *Bound) Revisions() map[string]uint64 {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out map[string]uint64
	for name, bb := range b.buckets {
		if rev := bb.Revision(); rev > 0 {
			if out == nil {
				out = map[string]uint64{}
			}
			out[name] = rev
		}
	}
	return out
}

// AllLoaded reports whether every bucket named has been read once (or found
// missing, or failed): no composition need wait for one.
func (b *Bound) AllLoaded() bool {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, bb := range b.buckets {
		if !bb.Loaded() {
			return false
		}
	}
	return true
}

// Behind returns the buckets named whose keys are not in yet, sorted.
func (b *Bound) Behind() []string {
	b.mu.RLock()
	defer b.mu.RUnlock()
	var out []string
	for name, bb := range b.buckets {
		if bb.Behind() {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// Counts returns how many buckets are followed and how many keys they hold.
func (b *Bound) Counts() (buckets, keys int) {
	b.mu.RLock()
	defer b.mu.RUnlock()
	for _, bb := range b.buckets {
		bb.mu.RLock()
		keys += len(bb.keys)
		bb.mu.RUnlock()
	}
	return len(b.buckets), keys
}

// Bucket returns the bucket's name.
func (bb *BoundBucket) Bucket() string { return bb.bucket }

// Revision returns the revision the copy of the bucket has reached.
func (bb *BoundBucket) Revision() uint64 {
	bb.mu.RLock()
	defer bb.mu.RUnlock()
	return bb.revision
}

// Behind says the bucket's keys are not in yet, or that it cannot be read
// (the server's identity may lack the grant: see permissions.ServerWriter).
func (bb *BoundBucket) Behind() bool {
	bb.mu.RLock()
	defer bb.mu.RUnlock()
	return !bb.loaded || bb.failing
}

// Loaded says the copy has read the bucket once, or found it missing, or
// failed to read it: what it holds is all a composition will get for now.
func (bb *BoundBucket) Loaded() bool {
	bb.mu.RLock()
	defer bb.mu.RUnlock()
	return bb.loaded
}

// WaitLoaded waits until Loaded, or ctx is done; it reports whether the
// bucket was loaded.
func (bb *BoundBucket) WaitLoaded(ctx context.Context) bool {
	for {
		bb.mu.RLock()
		loaded, advanced := bb.loaded, bb.advanced
		bb.mu.RUnlock()
		if loaded {
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-advanced:
		}
	}
}

// WaitFor waits until the copy of the bucket reaches revision, or ctx is
// done; it reports whether it did. A bucket found missing is looked for
// again at once: the asker knows of a revision of it.
func (bb *BoundBucket) WaitFor(ctx context.Context, revision uint64) bool {
	for {
		bb.mu.RLock()
		reached, advanced := bb.revision >= revision, bb.advanced
		bb.mu.RUnlock()
		if reached {
			return true
		}
		select {
		case bb.bound.wants <- bb: // look now, if it is not followed
		default:
		}
		select {
		case <-ctx.Done():
			return false
		case <-advanced:
		}
	}
}

// Keys returns the bucket's keys and their revisions.
func (bb *BoundBucket) Keys() map[string]uint64 {
	bb.mu.RLock()
	defer bb.mu.RUnlock()
	return maps.Clone(bb.keys)
}

// apply takes in one change of the bucket: a put's revision, or a delete.
// It reports false, taking nothing in, for a put of a new key past the
// copy's bound (SetMaxKeys).
func (bb *BoundBucket) apply(key string, revision uint64, deleted bool) bool {
	bb.mu.Lock()
	if deleted {
		delete(bb.keys, key)
	} else {
		if _, held := bb.keys[key]; !held && bb.bound.maxKeys > 0 && len(bb.keys) >= bb.bound.maxKeys {
			bb.mu.Unlock()
			return false
		}
		bb.keys[key] = revision
	}
	bb.revision = max(bb.revision, revision)
	bb.bound.mark(bb, false, key)
	bb.advance()
	bb.mu.Unlock()
	return true
}

// mark stamps a change of bb once it is in the copy, and before its
// waiters wake (a waiter then reads the change's stamp): of keys, by their
// first tokens, and, if shared, of the bucket as a whole.
func (b *Bound) mark(bb *BoundBucket, shared bool, keys ...string) {
	firsts := make([]string, 0, len(keys))
	for _, key := range keys {
		if first, _, _ := strings.Cut(key, "."); b.isNode == nil || b.isNode(first) {
			firsts = append(firsts, first)
		}
	}
	b.changedMu.Lock()
	defer b.changedMu.Unlock()
	// Counted under the lock with the marks: Changed and StampOf see every
	// mark up to the generation they read.
	gen := b.gen.Add(1)
	bb.changedAt = gen
	if shared {
		b.shared = gen
	}
	for _, first := range firsts {
		b.changed[first] = gen
	}
}

// Changed returns the first tokens (nodes with needs, by the bound entry's
// key shape) of the keys that changed in any bucket after the copy's stamp
// gen, the buckets that changed after it, and its stamp now. A first token
// is in firsts for a change of one of buckets: a reader of other buckets
// only has nothing new to read.
func (b *Bound) Changed(gen uint64) (firsts, buckets []string, now uint64) {
	b.mu.RLock() // before changedMu, as Bucket takes them
	defer b.mu.RUnlock()
	b.changedMu.RLock()
	defer b.changedMu.RUnlock()
	now = b.gen.Load()
	for first, at := range b.changed {
		if at > gen {
			firsts = append(firsts, first)
		}
	}
	for name, bb := range b.buckets {
		if bb.changedAt > gen {
			buckets = append(buckets, name)
		}
	}
	return firsts, buckets, now
}

// markMissing says the bucket does not exist, or no longer does: it
// holds no key, at no revision (one made again starts its revisions
// anew).
func (bb *BoundBucket) markMissing() {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	bb.settled = bb.looks
	if bb.loaded && !bb.failing && len(bb.keys) == 0 && bb.revision == 0 {
		return // found missing again: nothing changed
	}
	old := bb.keys
	bb.keys, bb.revision = map[string]uint64{}, 0
	bb.loaded, bb.failing = true, false
	bb.bound.mark(bb, true, slices.Collect(maps.Keys(old))...)
	bb.advance()
}

// beginLook counts a look begun, and returns its number.
func (bb *BoundBucket) beginLook() uint64 {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	bb.looks++
	return bb.looks
}

// failUnsettled marks the bucket failing, unless look read its keys or
// found it missing: the look goes on, and either marks the bucket again.
func (bb *BoundBucket) failUnsettled(look uint64) {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	if bb.settled != look {
		bb.markFailingLocked(false)
	}
}

// markFailing says the bucket cannot be read: its provisions are pending
// on what it held, or on nothing if drop is set.
func (bb *BoundBucket) markFailing(drop bool) {
	bb.mu.Lock()
	defer bb.mu.Unlock()
	bb.markFailingLocked(drop)
}

// markFailingLocked is markFailing, bb.mu held.
func (bb *BoundBucket) markFailingLocked(drop bool) {
	if bb.loaded && bb.failing && (!drop || len(bb.keys) == 0) {
		return
	}
	var dropped []string
	if drop {
		dropped = slices.Collect(maps.Keys(bb.keys))
		bb.keys = map[string]uint64{}
	}
	bb.loaded, bb.failing = true, true
	bb.bound.mark(bb, true, dropped...)
	bb.advance()
}

// advance wakes the waiters of a change stamped (Bound.mark); bb.mu is
// held.
func (bb *BoundBucket) advance() {
	close(bb.advanced)
	bb.advanced = make(chan struct{})
}

// Run follows every bucket named, until ctx is done: a bucket that exists
// through an ordered consumer that asks for headers only (watch), one that
// does not exist yet (or cannot be read) by looking for it every few
// seconds. A goroutine runs only for a bucket being looked for or
// followed: a bucket found missing costs its entry in the map, however
// many a node names.
func (b *Bound) Run(ctx context.Context, js jetstream.JetStream, logger *slog.Logger) {
	if logger == nil {
		logger = slog.Default()
	}
	// The buckets are those nodes' needs name, a thousand made-up ones
	// too: their failures are a line a minute, not a line a bucket.
	failures := ratelog.New(logger, ratelog.Period)
	var wg sync.WaitGroup
	defer wg.Wait()
	ended := make(chan *BoundBucket)
	start := func(bb *BoundBucket) {
		b.mu.RLock()
		forgotten := b.buckets[bb.bucket] != bb
		b.mu.RUnlock()
		if forgotten {
			// A wait on a bucket forgotten since: its name, read again,
			// makes another.
			return
		}
		if bb.running {
			// A wait for a revision, while the bucket was found missing
			// a moment ago: look again once this look ends.
			bb.again = true
			return
		}
		if bb.tooMany && time.Now().Before(bb.next) {
			// Each look reads as many keys as the bound: not sooner
			// for a wait.
			return
		}
		// The looks are bounded across every bucket named
		// (boundLookups): one not allowed now is looked for on a later
		// tick.
		if !b.lookups.Allow() {
			return
		}
		bb.running, bb.again = true, false
		wg.Go(func() {
			bb.follow(ctx, js, failures)
			select {
			case ended <- bb:
			case <-ctx.Done():
			}
		})
	}
	// Buckets named before Run, or while wants was full, are found in the
	// map, and those due to be looked for again: at the start and on each
	// tick. Buckets not running and named by nothing for a while are
	// forgotten.
	lookAll := func(now time.Time) {
		b.mu.RLock()
		named := slices.Collect(maps.Values(b.buckets))
		b.mu.RUnlock()
		forgot := false
		for _, bb := range named {
			switch {
			case bb.running:
			case b.forgetUnnamed(bb):
				forgot = true
			case !now.Before(bb.next):
				start(bb)
			}
		}
		if forgot {
			b.forgotten.Add(1)
		}
	}
	lookAll(time.Now())
	ticker := time.NewTicker(b.retry)
	defer ticker.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case bb := <-b.wants: // named, or a revision of it is waited for
			start(bb)
		case bb := <-ended:
			wait := b.retry
			if bb.tooMany { // each look reads as many keys as the bound
				wait *= boundCheck
			}
			bb.running, bb.next = false, time.Now().Add(wait)
			if bb.again {
				start(bb)
			}
		case now := <-ticker.C:
			b.now.Store(now.UnixNano())
			lookAll(now)
		}
	}
}

// follow looks for the bucket and follows it until ctx is done or it
// cannot: not found, or no longer (nothing is bound in a bucket not yet
// made, or deleted), or failing (its provisions read as pending, and
// answers say it is behind, rather than wait for it). Run looks again
// later.
func (bb *BoundBucket) follow(ctx context.Context, js jetstream.JetStream, failures *ratelog.Limiter) {
	err := bb.watch(ctx, js)
	bb.tooMany = errors.Is(err, ErrTooManyKeys)
	switch {
	case ctx.Err() != nil:
	case errors.Is(err, jetstream.ErrBucketNotFound), errors.Is(err, jetstream.ErrStreamNotFound):
		bb.markMissing()
		bb.warned = false
	default:
		bb.markFailing(bb.tooMany)
		if !bb.warned {
			failures.Log(slog.LevelWarn, "cannot follow a provider's bucket", "",
				"cannot follow a provider's bucket; its provisions read as pending, and answers say it is behind, until it can", "bucket", bb.bucket, "error", err)
			bb.warned = true
		}
	}
}

// watch reads the bucket's keys and follows them until ctx is done, the
// watcher stops, or the bucket is no longer the one it watched.
//
// It asks nats-server's JetStream API for one thing before the keys come:
// an ordered consumer of the last message of each key, headers only (a
// provider's values never reach the server), which says whether the
// bucket exists and how many keys it has. A KV watcher would bind the
// bucket first with a stream info, and the look read the stream's state
// with another, and nats-server answers stream infos only when no other
// API request waits: while instances made consumers of a large mesh's
// keys, a look timed out on them for up to 30 s, and every node's
// answer said the bucket was behind (bench-scale, one instance and
// four). The stream's state, which tells a bucket deleted and made again
// (its creation time) and a watcher that stalled, is read once the keys
// are in, and every boundCheck retries after.
func (bb *BoundBucket) watch(ctx context.Context, js jetstream.JetStream) error {
	look := bb.beginLook()
	slow := time.AfterFunc(apiTimeout, func() { bb.failUnsettled(look) })
	defer slow.Stop()
	began := time.Now()
	stream, prefix := wire.StreamOf(bb.bucket), wire.KVPrefix(bb.bucket)
	// Bounded: a request the server's identity may not send gets no
	// answer at all. Compositions wait for the bucket's first read no
	// longer than apiTimeout (boundLookWait).
	bind, cancel := context.WithTimeout(ctx, boundLookWait)
	consumer, err := js.OrderedConsumer(bind, stream, jetstream.OrderedConsumerConfig{
		FilterSubjects:    []string{prefix + ">"},
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		HeadersOnly:       true,
		InactiveThreshold: consumerInactive,
	})
	cancel()
	if err != nil {
		return err
	}
	messages, err := consumer.Messages()
	if err != nil {
		return err
	}
	// Its messages are handed over by a goroutine of their own, so that
	// the checks below go on while none come.
	deliveries, stopped, done := make(chan jetstream.Msg), make(chan error, 1), make(chan struct{})
	defer func() { close(done); messages.Stop() }()
	go func() {
		for {
			msg, err := messages.Next()
			if err != nil {
				stopped <- err
				return
			}
			select {
			case deliveries <- msg:
			case <-done:
				return
			}
		}
	}()
	// The keys the watcher starts with replace the copy's: a key deleted
	// while no watcher followed the bucket is not held on. Nil once they
	// are in.
	initial := map[string]uint64{}
	var top uint64 // the newest revision among them, deletes included
	keysIn := func() {
		bb.replace(initial, top)
		initial = nil
	}
	if consumer.CachedInfo().NumPending == 0 {
		keysIn() // an empty bucket
	}
	// A deleted bucket's watcher waits on, silent, and one made again
	// would be read from the old one's revisions on: the bucket's state
	// is read once its keys are in, then every boundCheck retries.
	check := time.NewTimer(0)
	if initial != nil {
		check.Stop()
	}
	defer check.Stop()
	var made time.Time // the stream's creation, once read
	var stalled stall
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-stopped:
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("the bucket's watcher stopped: %w", err)
		case msg := <-deliveries:
			meta, err := msg.Metadata()
			if err != nil {
				return fmt.Errorf("a message of the bucket's watcher: %w", err)
			}
			key, revision := strings.TrimPrefix(msg.Subject(), prefix), meta.Sequence.Stream
			deleted := wire.KVRemoves(msg.Headers())
			if initial == nil {
				if !bb.apply(key, revision, deleted) {
					return fmt.Errorf("%w (%d)", ErrTooManyKeys, bb.bound.maxKeys)
				}
				continue
			}
			if deleted {
				delete(initial, key) // a later put of it came before
			} else {
				initial[key] = revision
			}
			top = max(top, revision)
			if limit := bb.bound.maxKeys; limit > 0 && len(initial) > limit {
				return fmt.Errorf("%w (%d)", ErrTooManyKeys, limit)
			}
			if meta.NumPending == 0 {
				keysIn()
				check.Reset(0)
			}
		case <-check.C:
			check.Reset(boundCheck * bb.bound.retry)
			checkCtx, cancel := context.WithTimeout(ctx, apiTimeout)
			// The copy's revision first: the bucket's, read after, is at
			// least as new.
			revision, before := bb.Revision(), stalled.last
			now, last, err := bucketState(checkCtx, js, stream)
			cancel()
			switch {
			case ctx.Err() != nil:
				return nil
			case errors.Is(err, jetstream.ErrStreamNotFound):
				return err
			case err != nil:
				// An election, or a server slow to answer: the watcher
				// goes on, and the bucket is checked again next time.
			case made.IsZero() && now.After(began):
				return errors.New("the bucket was made while it was looked for: looking again")
			case made.IsZero():
				made, stalled = now, stall{last: last, revision: revision}
			case !now.Equal(made):
				return errors.New("the bucket was deleted and made again")
			case stalled.at(revision, last):
				return fmt.Errorf("%w: the bucket went from revision %d to %d since the last check, and its watcher delivered nothing past %d", ErrWatcherStalled, before, last, revision)
			}
		}
	}
}

// bucketState returns when the bucket's stream was made, and its last
// revision.
func bucketState(ctx context.Context, js jetstream.JetStream, stream string) (made time.Time, last uint64, err error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return time.Time{}, 0, err
	}
	info := s.CachedInfo()
	return info.Created, info.State.LastSeq, nil
}

// ErrWatcherStalled says a watcher delivered nothing while its bucket was
// written to: its consumer stopped delivering and nats.go did not notice
// (a consumer paused, or a delivery that never came with its heartbeats
// still coming). The watcher is started again from the bucket's keys.
var ErrWatcherStalled = errors.New("the bucket's watcher stalled")

// stall remembers, from one check of a watched bucket to the next (the
// first: its keys read), the bucket's last revision and the copy's.
type stall struct{ last, revision uint64 }

// at takes in a check and says whether the watcher stalled since the last
// one: the bucket was written to (its last revision moved) and the copy
// took in none of it (its revision did not move, and is behind). A
// healthy watcher delivers within boundCheck retries (30 s) what was
// written; a stalled one is noticed at the first check after a write.
// Reading the bucket's messages to tell a stall from a last message
// removed unread would read a provider's values, which the server never
// does; hence the write between checks.
func (s *stall) at(revision, last uint64) bool {
	stalled := last > s.last && revision == s.revision && revision < last
	*s = stall{last: last, revision: revision}
	return stalled
}

// replace sets the bucket's keys to a full read's, and marks it loaded.
func (bb *BoundBucket) replace(keys map[string]uint64, revision uint64) {
	bb.mu.Lock()
	bb.settled = bb.looks
	old := bb.keys
	bb.keys = keys
	bb.revision = max(bb.revision, revision)
	bb.loaded, bb.failing = true, false
	changed := make([]string, 0, len(keys)+len(old))
	for key := range keys {
		changed = append(changed, key)
	}
	for key := range old {
		changed = append(changed, key)
	}
	// Each key, for the plans writer (Changed), and the bucket as a whole:
	// it is loaded, or no longer failing.
	bb.bound.mark(bb, true, changed...)
	bb.advance()
	bb.mu.Unlock()
}

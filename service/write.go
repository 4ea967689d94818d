package service

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service/admission"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// The service is the only writer of the mesh's streams: nodes and providers
// ask it to write (put, delete, apply, declare, bind), and it checks that
// the write is the asker's, whose name the subject carries, before it
// stores it with the writing identity's connection and inbox. No asker's
// reply subject or header ever reaches JetStream (docs/security.md).

// MaxConcurrentWrites bounds the writes being stored at once, over every
// write verb: each holds a goroutine until JetStream acknowledges it. A
// write that finds them all taken is refused with a 503.
const MaxConcurrentWrites = 1024

// maxPendingPuts bounds the writer's puts awaiting JetStream's
// acknowledgement, over every apply at once (nats.go's default, 4,000,
// stalled 1,000 nodes' applies of 10 needs each); past it a write is
// refused with a 503.
const maxPendingPuts = 1 << 16

// writeTimeout bounds one write verb's work: JetStream's acknowledgements
// of its puts and deletes.
const writeTimeout = 5 * time.Second

// writeVerb is one write verb: the asker's names on its subject, its
// request, and how it is stored.
type writeVerb[Req proto.Message] struct {
	name, subject string
	// owner is the role of the subject's first name token; a verb with
	// tokens 2 names a node, then a provider (declare).
	owner  wire.Role
	tokens int
	// newRequest returns an empty request to decode into.
	newRequest func() Req
	// write checks and stores a decoded request for names (the subject's
	// tokens after the verb), and returns the answer or the refusal.
	write func(s *Service, ctx context.Context, names []string, in Req) (proto.Message, *wire.Error)
	// response is the answer's type, for the endpoint's metadata.
	response proto.Message
}

func (v writeVerb[Req]) subjectOf() string { return v.subject + strings.Repeat(".*", v.tokens) }

func (v writeVerb[Req]) names() (name, subject string) { return v.name, v.subjectOf() }

func (v writeVerb[Req]) namesAsker() bool { return v.owner != "" }

func (v writeVerb[Req]) register(s *Service, svc micro.Service, pt *partition) error {
	count := s.counters[v.name]
	prepare := func(r micro.Request) func(bool) { return v.prepare(s, count, r) }
	return s.addEndpoint(svc, pt, v.name, v.subject, v.subjectOf(), v.owner, s.maxWriteRatePerAsker, prepare,
		v.newRequest().ProtoReflect().Descriptor().FullName(), v.response.ProtoReflect().Descriptor().FullName())
}

// writeVerbs lists the write verbs.
func (s *Service) writeVerbs() []registrar {
	return []registrar{
		writeVerb[*provisionerv1.PutRequest]{name: wire.PutEndpoint, subject: wire.PutSubject, owner: wire.RoleNode, tokens: 1,
			newRequest: func() *provisionerv1.PutRequest { return &provisionerv1.PutRequest{} },
			write:      (*Service).putRecord, response: (*provisionerv1.WriteResponse)(nil)},
		writeVerb[*provisionerv1.DeleteRequest]{name: wire.DeleteEndpoint, subject: wire.DeleteSubject, owner: wire.RoleNode, tokens: 1,
			newRequest: func() *provisionerv1.DeleteRequest { return &provisionerv1.DeleteRequest{} },
			write:      (*Service).deleteRecord, response: (*provisionerv1.WriteResponse)(nil)},
		writeVerb[*provisionerv1.ApplyRequest]{name: wire.ApplyEndpoint, subject: wire.ApplySubject, owner: wire.RoleNode, tokens: 1,
			newRequest: func() *provisionerv1.ApplyRequest { return &provisionerv1.ApplyRequest{} },
			write:      (*Service).applyNeeds, response: (*provisionerv1.ApplyResponse)(nil)},
		writeVerb[*provisionerv1.DeclareRequest]{name: wire.DeclareEndpoint, subject: wire.DeclareSubject, owner: wire.RoleNode, tokens: 2,
			newRequest: func() *provisionerv1.DeclareRequest { return &provisionerv1.DeclareRequest{} },
			write:      (*Service).declareManifest, response: (*provisionerv1.WriteResponse)(nil)},
		writeVerb[*provisionerv1.BindRequest]{name: wire.BindEndpoint, subject: wire.BindSubject, owner: wire.RoleProvider, tokens: 1,
			newRequest: func() *provisionerv1.BindRequest { return &provisionerv1.BindRequest{} },
			write:      (*Service).bindKey, response: (*provisionerv1.WriteResponse)(nil)},
	}
}

// prepare reads and checks a write on the micro callback, where micro
// counts each refusal, and returns what stores it once its turn comes (at
// most MaxConcurrentWrites at once, each on a goroutine of its own, which
// answers once JetStream has acknowledged it), or nil when it was refused
// or gets no answer. A write whose reply subject is not the asker's own
// inbox (or a cross-account reply, _R_.) is neither stored nor answered: a
// JetStream acknowledgement aimed at a verb has no reply subject, and a
// node may not have its write answered into another's inbox.
func (v writeVerb[Req]) prepare(s *Service, count *counters, r micro.Request) (store func(onCallback bool)) {
	arrived := time.Now()
	names := strings.Split(strings.TrimPrefix(r.Subject(), v.subject+"."), ".")
	who := admission.Asker{Role: v.owner, Name: names[0]}
	if !s.replies.AnswersTo(r.Reply(), who.Role, who.Name) {
		s.refuseReply(r, count)
		return nil
	}
	r = s.observed(r, v.name, arrived)
	enc := answers.EncodingOf(r)
	for i, name := range names {
		role := v.owner
		if i > 0 {
			role = wire.RoleProvider
		}
		if werr := admission.CheckAddress(role, name); werr != nil {
			s.refuse(r, enc, count, werr, true)
			return nil
		}
	}
	in := v.newRequest()
	if werr := enc.Unmarshal(r.Data(), in); werr != nil {
		s.refuse(r, enc, count, werr, true)
		return nil
	}
	return func(onCallback bool) { v.store(s, count, r, who, names, in, enc, onCallback) }
}

// store writes a checked request on a goroutine of its own, which answers
// once JetStream has acknowledged it, or refuses it at once.
func (v writeVerb[Req]) store(s *Service, count *counters, r micro.Request, who admission.Asker, names []string, in Req, enc answers.Encoding, onCallback bool) {
	if !s.mirror.Ready() {
		// The budgets and an apply's comparison read the copy.
		s.refuse(r, enc, count, s.answers.StillLoading(), onCallback)
		return
	}
	t, werr := s.enterWaiting(who, count, s.writing, func() *wire.Error {
		count.queueFull.Add(1)
		return wire.Errorf(wire.CodeUnavailable, "the server is storing as many writes as it may at once (%d); write again shortly", MaxConcurrentWrites)
	})
	if werr != nil {
		s.refuse(r, enc, count, werr, onCallback)
		return
	}
	go func() {
		defer t.done()
		ctx, cancel := context.WithTimeout(s.stopping, writeTimeout)
		defer cancel()
		out, werr := v.write(s, ctx, names, in)
		var data []byte
		if werr == nil {
			var err error
			if data, err = enc.Marshal(out); err != nil {
				werr = wire.Errorf(wire.CodeInternal, "encoding the answer: %v", err)
			}
		}
		s.send(r, enc, count, data, werr)
	}()
}

// stateBucket is one bucket of nodes' records as the write verbs store it.
type stateBucket struct {
	bucket string
	kv     jetstream.KeyValue
	// maxValue is the bucket's largest value, as its stream's
	// max_msg_size says (0: none but the server's max_payload).
	maxValue int
	// held is the bucket's copy, whose budget a put must fit.
	held heldCopy
	// stored is how the bucket stores its keys, which a read of a node's
	// subjects names.
	stored wire.StoredKeys
}

// checked is what the admission's CheckValue reads of the bucket.
func (b *stateBucket) checked() admission.Bucket {
	return admission.Bucket{Name: b.bucket, MaxValue: b.maxValue, Held: b.held}
}

// heldCopy is what the write verbs read of a state bucket's copy: its
// budget, a node's values and how far it is.
type heldCopy interface {
	Fits(first, key string, size int) bool
	Budget() mirror.Budget
	FitsReplacing(first, prefix string, keys, bytes int) bool
	Values(first string, each func(key, value string)) uint64
	Revision() uint64
	WaitFor(ctx context.Context, revision uint64) bool
}

// writeStore is what the write verbs store through: the writing identity's
// JetStream and the state buckets bound with it.
type writeStore struct {
	js      jetstream.JetStream
	buckets map[string]*stateBucket

	// bound are the providers' buckets bound so far, made on a provider's
	// first bind.
	boundMu sync.Mutex
	bound   map[string]jetstream.KeyValue
}

// openWriteStore binds the state buckets through js, which is the writing
// identity's.
func openWriteStore(ctx context.Context, js jetstream.JetStream, m *mirror.Mirror) (*writeStore, error) {
	w := &writeStore{js: js, buckets: map[string]*stateBucket{}, bound: map[string]jetstream.KeyValue{}}
	for _, b := range []struct {
		bucket string
		held   heldCopy
	}{{keys.NeedsBucket, m.Needs}, {keys.AppliedBucket, m.Applied}, {keys.CollectBucket, m.Collect}, {keys.ManifestsBucket, m.Manifests}} {
		kv, err := js.KeyValue(ctx, b.bucket)
		if err != nil {
			return nil, fmt.Errorf("bind bucket %s for writes: %w", b.bucket, err)
		}
		st, err := kv.Status(ctx)
		if err != nil {
			return nil, fmt.Errorf("read bucket %s's limits: %w", b.bucket, err)
		}
		sb := &stateBucket{bucket: b.bucket, kv: kv, held: b.held, stored: wire.StoredKeys{Bucket: b.bucket}}
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
			sc := bs.StreamInfo().Config
			sb.maxValue = int(max(sc.MaxMsgSize, 0))
			if sb.stored, err = wire.StoredKeysOf(b.bucket, sc.SubjectTransform); err != nil {
				return nil, err
			}
		}
		w.buckets[b.bucket] = sb
	}
	return w, nil
}

// lastOfModule returns the revision of the newest write of any key of
// node's module in b (delete markers included), 0 when none is stored: a
// direct get of the last message on the module's stored subjects, which the
// stream's leader answers beside its other reads, not in the JetStream
// API's queue.
func (w *writeStore) lastOfModule(ctx context.Context, b *stateBucket, node, module string) (uint64, error) {
	msg, err := kvread.Last(ctx, w.js, wire.StreamOf(b.bucket), b.stored.NodePrefix(node)+module+".>")
	switch {
	case errors.Is(err, kvread.ErrNoMessage):
		return 0, nil
	case err != nil:
		return 0, err
	}
	return strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
}

// bucketOf returns the bucket a node's record names, refusing the registry
// and manifests, which nodes do not put.
func (w *writeStore) bucketOf(what provisionerv1.What) (*stateBucket, *wire.Error) {
	switch what {
	case provisionerv1.What_WHAT_NEEDS:
		return w.buckets[keys.NeedsBucket], nil
	case provisionerv1.What_WHAT_APPLIED:
		return w.buckets[keys.AppliedBucket], nil
	case provisionerv1.What_WHAT_COLLECT:
		return w.buckets[keys.CollectBucket], nil
	case provisionerv1.What_WHAT_MANIFESTS:
		return nil, wire.NewError(wire.CodeBadRequest, "a manifest is declared on mesh-provisioner.declare.<node>.<provider>, not put: send a DeclareRequest there")
	}
	return nil, wire.Errorf(wire.CodeBadRequest, "what is %s: a node writes WHAT_NEEDS, WHAT_APPLIED or WHAT_COLLECT; the registry is the service's own", what)
}

// stored returns the refusal of a write JetStream did not acknowledge.
func stored(what string, err error) *wire.Error {
	if errors.Is(err, context.Canceled) {
		return answers.ErrStopping
	}
	return wire.Errorf(wire.CodeUnavailable, "storing %s failed (%v): nothing is lost that was acknowledged; write again shortly", what, err)
}

func (s *Service) putRecord(ctx context.Context, names []string, in *provisionerv1.PutRequest) (proto.Message, *wire.Error) {
	node, rec := names[0], in.GetRecord()
	b, werr := s.store.bucketOf(rec.GetWhat())
	if werr != nil {
		return nil, werr
	}
	if werr := admission.OwnKey(b.bucket, node, rec.GetKey()); werr != nil {
		return nil, werr
	}
	if werr := admission.CheckValue(b.checked(), node, rec.GetKey(), rec.GetValue()); werr != nil {
		return nil, werr
	}
	revision, err := b.kv.Put(ctx, rec.GetKey(), rec.GetValue())
	if err != nil {
		return nil, stored(keys.Echo(rec.GetKey()), err)
	}
	return &provisionerv1.WriteResponse{Bucket: b.bucket, Key: rec.GetKey(), Revision: revision}, nil
}

func (s *Service) deleteRecord(ctx context.Context, names []string, in *provisionerv1.DeleteRequest) (proto.Message, *wire.Error) {
	node := names[0]
	b, werr := s.store.bucketOf(in.GetWhat())
	if werr != nil {
		return nil, werr
	}
	if werr := admission.OwnKey(b.bucket, node, in.GetKey()); werr != nil {
		return nil, werr
	}
	revision, err := deleteKey(ctx, s.store.js, b.bucket, in.GetKey())
	if err != nil {
		return nil, stored("the delete of "+keys.Echo(in.GetKey()), err)
	}
	return &provisionerv1.WriteResponse{Bucket: b.bucket, Key: in.GetKey(), Revision: revision}, nil
}

// wireDelete returns the message that deletes key of bucket: a KV delete
// marker, as jetstream's Delete publishes it.
func wireDelete(bucket, key string) *nats.Msg {
	msg := nats.NewMsg(wire.KVSubject(bucket, key))
	msg.Header.Set(wire.KVOperationHeader, wire.KVOperationDelete)
	return msg
}

// deleteKey writes a KV delete marker of key, as jetstream's Delete does,
// and returns its revision, which Delete does not.
func deleteKey(ctx context.Context, js jetstream.JetStream, bucket, key string) (uint64, error) {
	msg := wireDelete(bucket, key)
	ack, err := js.PublishMsg(ctx, msg)
	if err != nil {
		return 0, err
	}
	return ack.Sequence, nil
}

func (s *Service) applyNeeds(ctx context.Context, names []string, in *provisionerv1.ApplyRequest) (proto.Message, *wire.Error) {
	node, module := names[0], in.GetModule()
	if werr := admission.CheckName("module", module, true); werr != nil {
		return nil, werr
	}
	b := s.store.buckets[keys.NeedsBucket]
	prefix := node + "." + module + "."
	want := make(map[string][]byte, len(in.GetNeeds()))
	size := 0
	for _, rec := range in.GetNeeds() {
		if what := rec.GetWhat(); what != provisionerv1.What_WHAT_UNSPECIFIED && what != provisionerv1.What_WHAT_NEEDS {
			return nil, wire.Errorf(wire.CodeBadRequest, "an apply holds needs only; record %q is of %s", keys.Echo(rec.GetKey()), what)
		}
		if werr := admission.OwnKey(b.bucket, node, rec.GetKey()); werr != nil {
			return nil, werr
		}
		if !strings.HasPrefix(rec.GetKey(), prefix) {
			module := keys.Echo(module)
			return nil, wire.Errorf(wire.CodeBadRequest, "need %q is not of module %s: an apply of module %s holds keys that start with %q", keys.Echo(rec.GetKey()), module, module, keys.Echo(prefix))
		}
		if _, dup := want[rec.GetKey()]; dup {
			return nil, wire.Errorf(wire.CodeBadRequest, "need %q is twice in the set: each key once", keys.Echo(rec.GetKey()))
		}
		if werr := admission.CheckValue(b.checked(), node, rec.GetKey(), rec.GetValue()); werr != nil {
			return nil, werr
		}
		want[rec.GetKey()] = rec.GetValue()
		size += len(rec.GetValue())
	}
	// Compared with the module's keys as they are now: the copy is first
	// brought to the newest write of any of them, so that no write made
	// meanwhile is taken for unchanged, nor a key written meanwhile left
	// undeleted. Only the module's own writes are waited for: under a
	// mesh's writes the copy may trail the stream's last revision by more
	// than an apply may wait. A sender that knows the module's last write
	// says its revision: when the copy holds it, the bucket is not asked.
	// A revision the copy does not hold yet is not waited for, but read
	// from the bucket: a sender that names one past any write would
	// otherwise hold a write's place for as long as it waits.
	last := in.GetMinRevision()
	if last == 0 || b.held.Revision() < last {
		var err error
		if last, err = s.store.lastOfModule(ctx, b, node, module); err != nil {
			return nil, stored("the apply of "+keys.Echo(module), err)
		}
	}
	if !b.held.WaitFor(ctx, last) {
		return nil, wire.Errorf(wire.CodeUnavailable, "the server's copy of %s has not reached revision %d yet; apply again shortly", b.bucket, last)
	}
	var held []string
	unchanged := map[string]bool{}
	b.held.Values(node, func(key, value string) {
		if !strings.HasPrefix(key, prefix) {
			return
		}
		held = append(held, key)
		if v, ok := want[key]; ok && string(v) == value {
			unchanged[key] = true
		}
	})
	if !b.held.FitsReplacing(node, prefix, len(want), size) {
		return nil, wire.Errorf(wire.CodeTooLarge, "node %s has no room for module %s's %d needs in %s: it would hold more than the server keeps of one node there, %s (--node-max-keys, --node-max-bytes); delete some of its keys first", keys.Echo(node), keys.Echo(module), len(want), b.bucket, b.held.Budget())
	}
	out := &provisionerv1.ApplyResponse{Revision: max(last, b.held.Revision()), Unchanged: uint32(len(unchanged))}
	var acks []jetstream.PubAckFuture
	for key, value := range want {
		if unchanged[key] {
			continue
		}
		ack, err := s.store.js.PublishAsync(wire.KVSubject(b.bucket, key), value)
		if err != nil {
			return nil, stored(keys.Echo(key), err)
		}
		acks = append(acks, ack)
		out.Written++
	}
	for _, key := range held {
		if _, ok := want[key]; ok {
			continue
		}
		ack, err := s.store.js.PublishMsgAsync(wireDelete(b.bucket, key))
		if err != nil {
			return nil, stored("the delete of "+keys.Echo(key), err)
		}
		acks = append(acks, ack)
		out.Deleted++
	}
	for _, ack := range acks {
		select {
		case pa := <-ack.Ok():
			out.Revision = max(out.GetRevision(), pa.Sequence)
		case err := <-ack.Err():
			return nil, stored("the apply of "+keys.Echo(module), err)
		case <-ctx.Done():
			return nil, stored("the apply of "+keys.Echo(module), ctx.Err())
		}
	}
	return out, nil
}

func (s *Service) declareManifest(ctx context.Context, names []string, in *provisionerv1.DeclareRequest) (proto.Message, *wire.Error) {
	node, provider := names[0], names[1]
	b := s.store.buckets[keys.ManifestsBucket]
	key, err := keys.ManifestKey{Node: node, Provider: provider}.Key()
	if err != nil {
		return nil, wire.Errorf(wire.CodeBadRequest, "%v", err)
	}
	if in.GetWithdraw() {
		revision, err := deleteKey(ctx, s.store.js, b.bucket, key)
		if err != nil {
			return nil, stored("the withdrawal of "+keys.Echo(key), err)
		}
		return &provisionerv1.WriteResponse{Bucket: b.bucket, Key: key, Revision: revision}, nil
	}
	if werr := admission.CheckValue(b.checked(), node, key, in.GetManifest()); werr != nil {
		return nil, werr
	}
	revision, err := b.kv.Put(ctx, key, in.GetManifest())
	if err != nil {
		return nil, stored(keys.Echo(key), err)
	}
	return &provisionerv1.WriteResponse{Bucket: b.bucket, Key: key, Revision: revision, Digest: wire.ManifestDigest(in.GetManifest())}, nil
}

// MaxBoundValue is the largest value a provider binds: what
// buckets.DefaultMaxValueSize allows a node's record.
const MaxBoundValue = 64 << 10

func (s *Service) bindKey(ctx context.Context, names []string, in *provisionerv1.BindRequest) (proto.Message, *wire.Error) {
	provider, key := names[0], in.GetKey()
	if werr := admission.CheckName("key", key, false); werr != nil {
		return nil, werr
	}
	if err := keys.CheckBoundKey(key); err != nil {
		return nil, wire.Errorf(wire.CodeBadRequest, "key %q of %s: %v", keys.Echo(key), wire.BoundBucket(keys.Echo(provider)), err)
	}
	if len(in.GetValue()) > MaxBoundValue {
		return nil, wire.Errorf(wire.CodeTooLarge, "the value of %s is %d bytes, more than the %s a provider binds of one value: bind a smaller one", keys.Echo(key), len(in.GetValue()), admission.ByteSize(MaxBoundValue))
	}
	kv, err := s.store.boundOf(ctx, provider)
	if err != nil {
		return nil, stored(wire.BoundBucket(keys.Echo(provider)), err)
	}
	var revision uint64
	if in.GetUnbind() {
		revision, err = deleteKey(ctx, s.store.js, kv.Bucket(), key)
	} else {
		revision, err = kv.Put(ctx, key, in.GetValue())
	}
	if err != nil {
		return nil, stored(keys.Echo(key), err)
	}
	return &provisionerv1.WriteResponse{Bucket: kv.Bucket(), Key: key, Revision: revision}, nil
}

// boundOf returns provider's bucket, made if missing: one value a key, as
// the server follows it.
func (w *writeStore) boundOf(ctx context.Context, provider string) (jetstream.KeyValue, error) {
	w.boundMu.Lock()
	defer w.boundMu.Unlock()
	if kv := w.bound[provider]; kv != nil {
		return kv, nil
	}
	bucket := wire.BoundBucket(provider)
	kv, err := w.js.KeyValue(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		kv, err = w.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket, MaxValueSize: MaxBoundValue,
			Description: "what provider " + provider + " has provisioned, written through mesh-provisioner.bind." + provider})
	}
	if err != nil {
		return nil, err
	}
	w.bound[provider] = kv
	return kv, nil
}

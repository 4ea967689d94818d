//go:build faults

package faults_test

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// probe writes needs and asks the service about them side by side, and
// keeps what happened to each: when a write was acked (or failed), and which
// revision each answer reflected and when.
type probe struct {
	t      *testing.T
	writes *nats.Conn     // the writer's: it asks the put verb as node writer
	ask    *client.Client // the reader's
	writer string         // the node written, so that keys are unique

	mu      sync.Mutex
	acked   []write
	failed  []write
	answers []answer
	errs    []answer // requests that failed, and when
	// answered is signalled (without blocking) after each answer.
	answered chan struct{}
}

type write struct {
	key      string
	revision uint64
	at       time.Time
	err      error
}

type answer struct {
	at       time.Time
	revision uint64
	behind   []string
	err      error
}

func newProbe(t *testing.T, writer, reader *nats.Conn, node string) *probe {
	t.Helper()
	return &probe{t: t, writes: writer, ask: client.New(reader), writer: node, answered: make(chan struct{}, 1)}
}

// reflectWithin bounds how long stop waits for an answer to reflect the
// last acked write: a liveness bound, generous (it is waited out only when
// a write never reaches answers), not the freshness.
const reflectWithin = 30 * time.Second

// run writes every writeEvery and asks every askEvery until stop is
// called; stop ends the writes first, and the asking once an answer
// reflects the last acked write (or reflectWithin later).
func (p *probe) run(writeEvery, askEvery time.Duration) (stop func()) {
	writing, stopWriting := context.WithCancel(context.Background())
	asking, stopAsking := context.WithCancel(context.Background())
	var writer, reader sync.WaitGroup
	writer.Go(func() {
		for i := 0; writing.Err() == nil; i++ {
			p.put(writing, fmt.Sprintf("%s.m.port.k%06d", p.writer, i))
			sleep(writing, writeEvery)
		}
	})
	reader.Go(func() {
		for asking.Err() == nil {
			p.poll(asking)
			sleep(asking, askEvery)
		}
	})
	return func() {
		stopWriting()
		writer.Wait()
		// Each answer is checked as it comes, for at most reflectWithin.
		deadline := time.After(reflectWithin)
	wait:
		for !p.reflectsLast() {
			select {
			case <-p.answered:
			case <-deadline:
				break wait
			}
		}
		stopAsking()
		reader.Wait()
	}
}

// waitWrites waits until n writes acked at or after from are in answers
// (an answer reflects the n-th of them), and fails the test if they are not
// within the timeout: the traffic a fault's figures are taken from, counted
// rather than timed.
func (p *probe) waitWrites(from time.Time, n int, timeout time.Duration) {
	p.t.Helper()
	natstest.CheckFor(p.t, timeout, func() error {
		p.mu.Lock()
		defer p.mu.Unlock()
		acked := 0
		for _, w := range p.acked {
			if w.at.Before(from) {
				continue
			}
			if acked++; acked == n {
				if len(p.answers) == 0 || p.answers[len(p.answers)-1].revision < w.revision {
					return fmt.Errorf("%d writes acked since %s, the %dth (revision %d) not in answers yet", acked, from.Format("15:04:05.000"), n, w.revision)
				}
				return nil
			}
		}
		return fmt.Errorf("%d writes acked since %s, want %d in answers", acked, from.Format("15:04:05.000"), n)
	})
}

// reflectsLast reports whether an answer reflects the last acked write.
func (p *probe) reflectsLast() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if len(p.acked) == 0 || len(p.answers) == 0 {
		return len(p.acked) == 0
	}
	return p.answers[len(p.answers)-1].revision >= p.acked[len(p.acked)-1].revision
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}

var needValue, _ = proto.Marshal(&provisionerv1.Need{Placeholder: "${port:probe}", Required: true})

// putNeed asks the put verb as node to write key with needValue, and
// returns the revision it was stored at.
func putNeed(ctx context.Context, nc *nats.Conn, node, key string) (uint64, error) {
	body, err := proto.Marshal(&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: key, Value: needValue}})
	if err != nil {
		return 0, err
	}
	reply, err := wire.Request(ctx, nc, wire.RoleNode, node, &nats.Msg{Subject: wire.NodeSubject(wire.PutSubject, node), Data: body})
	if err != nil {
		return 0, err
	}
	if err := wire.ErrorOf(reply); err != nil {
		return 0, err
	}
	var out provisionerv1.WriteResponse
	if err := proto.Unmarshal(reply.Data, &out); err != nil {
		return 0, err
	}
	return out.GetRevision(), nil
}

func (p *probe) put(ctx context.Context, key string) {
	putCtx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	// Through the service's put verb, as a node writes: acked means the
	// service's answer, sent once JetStream acknowledged the write.
	rev, err := putNeed(putCtx, p.writes, p.writer, key)
	if ctx.Err() != nil {
		return // the test ended: neither acked nor failed
	}
	w := write{key: key, revision: rev, at: time.Now(), err: err}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.failed = append(p.failed, w)
	} else {
		p.acked = append(p.acked, w)
	}
}

func (p *probe) poll(ctx context.Context) {
	askCtx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	res, err := p.ask.Provisioning(askCtx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "nobody"})
	if ctx.Err() != nil {
		return
	}
	a := answer{at: time.Now(), err: err}
	if err == nil {
		a.revision, a.behind = res.GetRevision(), res.GetBehind()
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil {
		p.errs = append(p.errs, a)
		return
	}
	p.answers = append(p.answers, a)
	select {
	case p.answered <- struct{}{}:
	default:
	}
}

// lag is, for each acked write, how long after its ack an answer first
// reflected it; a write no answer reflected yet has lag -1.
type lag struct {
	write
	lag time.Duration
}

// lags matches each acked write with the first answer at or past its
// revision. That answer may have been noted before the ack was: the
// service's copy can take the write from the stream before the put's
// reply reaches the writer, and the two goroutines take time.Now() apart.
// Such a write was in answers when acked: lag 0.
func (p *probe) lags() []lag {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]lag, 0, len(p.acked))
	for _, w := range p.acked {
		l := lag{write: w, lag: -1}
		for _, a := range p.answers {
			if a.revision >= w.revision {
				l.lag = max(a.at.Sub(w.at), 0)
				break
			}
		}
		out = append(out, l)
	}
	return out
}

// worst returns the longest lag of the writes acked at or after from, and
// the write that had it; a write never reflected counts as forever.
func worst(lags []lag, from time.Time) (lag, int) {
	var w lag
	n := 0
	for _, l := range lags {
		if l.at.Before(from) {
			continue
		}
		n++
		if l.lag < 0 {
			return l, n
		}
		if l.lag > w.lag {
			w = l
		}
	}
	return w, n
}

// checkCopy asserts that the service's copy of the needs bucket holds
// exactly the bucket's keys at their revisions, and every acked write.
func (p *probe) checkCopy(ctx context.Context, reader *nats.Conn) {
	p.t.Helper()
	// A read through a consumer on a replica that is still catching up (a
	// server just restarted) may miss the last writes: read until it holds
	// the stream's last revision, as its leader says.
	js, err := jetstream.New(p.writes)
	if err != nil {
		p.t.Fatal(err)
	}
	needs, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		p.t.Fatal(err)
	}
	var live []jetstream.KeyValueEntry
	var last uint64
	deadline, _ := ctx.Deadline()
	natstest.CheckFor(p.t, time.Until(deadline), func() error {
		status, err := needs.Status(ctx)
		if err != nil {
			p.t.Fatal(err)
		}
		last = status.(interface{ StreamInfo() *jetstream.StreamInfo }).StreamInfo().State.LastSeq
		live, err = kvread.Live(ctx, needs)
		if err != nil {
			p.t.Fatalf("read the needs bucket: %v", err)
		}
		if !slices.ContainsFunc(live, func(e jetstream.KeyValueEntry) bool { return e.Revision() == last }) {
			return fmt.Errorf("a read of the needs bucket does not hold its last revision %d yet", last)
		}
		return nil
	})
	want := map[string]uint64{}
	for _, e := range live {
		want[e.Key()] = e.Revision()
	}
	res, err := client.New(reader).ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last})
	if err != nil {
		p.t.Fatalf("ask for every need at revision %d: %v", last, err)
	}
	got := map[string]uint64{}
	for _, n := range res.GetNeeds() {
		key, err := keys.NeedKey{Node: n.GetNode(), Module: n.GetModule(), Kind: n.GetKind(), Name: n.GetName()}.Key()
		if err != nil {
			p.t.Fatal(err)
		}
		got[key] = n.GetRevision()
	}
	for _, m := range res.GetMalformed() {
		got[m.GetKey()] = m.GetRevision()
	}
	var missing, extra, stale []string
	for k, r := range want {
		switch g, ok := got[k]; {
		case !ok:
			missing = append(missing, k)
		case g != r:
			stale = append(stale, fmt.Sprintf("%s@%d (bucket %d)", k, g, r))
		}
	}
	for k := range got {
		if _, ok := want[k]; !ok {
			extra = append(extra, k)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing)+len(extra)+len(stale) > 0 {
		p.t.Errorf("the copy differs from the bucket: missing %v, extra %v, other revisions %v", missing, extra, stale)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	lost := 0
	for _, w := range p.acked {
		if _, ok := want[w.key]; !ok {
			lost++
			p.t.Errorf("acked write %s at revision %d is not in the bucket", w.key, w.revision)
		}
	}
	inBucket := 0
	for _, w := range p.failed {
		if _, ok := want[w.key]; ok {
			inBucket++
		}
	}
	p.t.Logf("copy equals the bucket: %d keys at revision %d; %d acked writes, %d lost; %d writes failed, %d of them in the bucket anyway",
		len(want), last, len(p.acked), lost, len(p.failed), inBucket)
}

// report logs the figures of a run: the worst lag after from, and the
// requests that failed.
func (p *probe) report(name string, from time.Time) lag {
	p.t.Helper()
	lags := p.lags()
	w, n := worst(lags, from)
	p.mu.Lock()
	answers, errs, behind := len(p.answers), len(p.errs), 0
	for _, a := range p.answers {
		if len(a.behind) > 0 {
			behind++
		}
	}
	var firstErr error
	if errs > 0 {
		firstErr = p.errs[0].err
	}
	p.mu.Unlock()
	p.t.Logf("%s: %d writes acked after the fault; worst lag from ack to answer %s (%s at revision %d); %d answers (%d saying a copy may be behind), %d failed requests (first: %v)",
		name, n, w.lag.Round(time.Millisecond), w.key, w.revision, answers, behind, errs, firstErr)
	return w
}

// firstAnswer returns how long after from the first answer came.
func (p *probe) firstAnswer(from time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range p.answers {
		if !a.at.Before(from) {
			return a.at.Sub(from)
		}
	}
	return -1
}

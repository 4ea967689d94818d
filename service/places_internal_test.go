package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// A node that asks, on its own subject, distinct questions faster than the
// workers answer them (a page size each, so that no answer is reused and
// no two requests are identical) holds at most MaxPerAsker places of the
// queue: another node asking meanwhile is answered each time. Without the
// bound, the greedy node kept the queue (128 a worker) full, and the other
// node's requests were refused "overloaded".
func TestAGreedyNodeLeavesRoomInTheQueue(t *testing.T) {
	t.Parallel()
	const most = 8
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 2, Modules: 60, Needs: 25}, Config{Concurrency: 1, MaxPerAsker: most})
	greedy, other := mesh.Nodes[0].Name, mesh.Nodes[1].Name

	ctx, stop := context.WithCancel(t.Context())
	var asked atomic.Int64
	var greed sync.WaitGroup
	greed.Go(func() { askInALoop(ctx, t, nc, greedy, &asked) })
	defer greed.Wait()
	defer stop()

	ask := client.New(nc, client.AsNode(other))
	count := s.counters[wire.ComposeNodeEndpoint]
	for i := range 10 {
		// Asked each time the greedy node has just been refused again for
		// holding its places: while it holds all it may.
		seen := count.askerFull.Load()
		natstest.CheckFor(t, 10*time.Second, func() error {
			if count.askerFull.Load() == seen {
				return fmt.Errorf("%s asked %d times in a loop, and no more were refused for holding %d places (%d so far)", greedy, asked.Load(), most, seen)
			}
			return nil
		})
		if _, err := ask.Compose(t.Context(), &provisionerv1.ComposeRequest{Node: other}); err != nil {
			t.Errorf("%s's request %d, while %s asked in a loop: %v", other, i, greedy, err)
		}
	}
	stop()
	greed.Wait()
	if count.askerFull.Load() == 0 || count.queueFull.Load() > 0 {
		t.Errorf("%s asked %d times: %d refused for holding %d places, %d for a full queue; want some for its places and none for the queue",
			greedy, asked.Load(), count.askerFull.Load(), most, count.queueFull.Load())
	}
	t.Logf("%s asked %d times: %d refused for holding %d places", greedy, asked.Load(), count.askerFull.Load(), most)
}

// askInALoop asks node's composition on its own subject, each request
// another page size, as fast as the service reads them, without waiting for
// the answers, until ctx is done.
func askInALoop(ctx context.Context, t *testing.T, nc *nats.Conn, node string, asked *atomic.Int64) {
	inbox := wire.InboxPrefix(wire.RoleNode, node) + ".greedy"
	sub, err := nc.Subscribe(inbox+".*", func(*nats.Msg) {})
	if err != nil {
		t.Error(err)
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	pace := time.NewTicker(time.Millisecond)
	defer pace.Stop()
	for i := 1; ctx.Err() == nil; i++ {
		body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: node, PageSize: uint32(i)})
		if err := nc.PublishRequest(wire.NodeSubject(wire.ComposeSubject, node), fmt.Sprintf("%s.%d", inbox, i), body); err != nil {
			t.Error(err)
			return
		}
		asked.Add(1)
		// As fast as the service's callback reads them, which refuses
		// the requests past the node's places at once: a blast that
		// outran it would drop every node's requests from the
		// endpoint's pending buffer, which is not this test's bound.
		if i%16 == 0 {
			if err := nc.FlushTimeout(time.Second); err != nil {
				t.Error(err)
				return
			}
			select { // at most 16 a millisecond: pacing
			case <-ctx.Done():
			case <-pace.C:
			}
		}
	}
}

// A node that asks, on its own subject, for revisions far ahead holds at
// most MaxPerAsker of the places of requests that wait: another node's
// request for a revision about to come waits, and is answered once it
// comes. Without the bound, the greedy node's requests took every place
// (MaxWaiting), and the other node's was refused.
func TestAGreedyNodeLeavesRoomToWait(t *testing.T) {
	t.Parallel()
	const most, places = 8, 32
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 2, Modules: 2, Needs: 2},
		Config{MaxPerAsker: most, MaxWaiting: places, RevisionWait: time.Minute})
	greedy, other := mesh.Nodes[0].Name, mesh.Nodes[1].Name

	// Each waits a minute, for a revision the needs will not reach.
	ahead := &provisionerv1.Revisions{Needs: 1 << 40}
	var refused, forPlaces atomic.Int64
	var othersMu sync.Mutex
	var others []string // the refusals not for places, said on failure
	var asking sync.WaitGroup
	greedyCtx, stop := context.WithCancel(t.Context())
	defer asking.Wait()
	defer stop()
	for range 4 * places {
		asking.Go(func() {
			_, err := client.New(nc, client.AsNode(greedy)).Compose(greedyCtx, &provisionerv1.ComposeRequest{Node: greedy, MinRevisions: ahead})
			if greedyCtx.Err() != nil {
				return // stopped waiting: the test is over
			}
			refused.Add(1)
			var werr *wire.Error
			if errors.As(err, &werr) && strings.Contains(werr.Sentence(), fmt.Sprintf("%d requests of node %s already", most, greedy)) {
				forPlaces.Add(1)
				return
			}
			othersMu.Lock()
			others = append(others, fmt.Sprint(err))
			othersMu.Unlock()
		})
	}
	// Every greedy request waits or was refused.
	natstest.CheckFor(t, 10*time.Second, func() error {
		if n, r := len(s.waiting), int(refused.Load()); n+r < 4*places {
			return fmt.Errorf("%d greedy requests wait and %d were refused, of %d", n, r, 4*places)
		}
		return nil
	})
	if len(s.waiting) != most || forPlaces.Load() != 4*places-most {
		othersMu.Lock()
		t.Errorf("%d of %s's %d requests wait, and %d of the others were refused for its places; want %d: its places, and all the others; refused otherwise: %q",
			len(s.waiting), greedy, 4*places, forPlaces.Load(), most, others)
		othersMu.Unlock()
	}

	// The other node asks for the revision of a need it writes next.
	rev := s.mirror.Needs.Revision()
	answered := make(chan error, 1)
	go func() {
		_, err := client.New(nc, client.AsNode(other)).Compose(t.Context(), &provisionerv1.ComposeRequest{Node: other, MinRevisions: &provisionerv1.Revisions{Needs: rev + 1}})
		answered <- err
	}()
	// Its request waits (a place more is taken), or was refused at once
	// (answered, which the check below reports).
	natstest.CheckFor(t, 10*time.Second, func() error {
		if n := len(s.waiting); n != most+1 && len(answered) == 0 {
			return fmt.Errorf("%d requests wait, want %s's %d and %s's", n, greedy, most, other)
		}
		return nil
	})
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	needs, err := js.KeyValue(t.Context(), keys.NeedsBucket)
	if err != nil {
		t.Fatal(err)
	}
	need, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	if _, err := needs.Put(t.Context(), other+".web.port.http", need); err != nil {
		t.Fatal(err)
	}
	if err := <-answered; err != nil {
		t.Errorf("%s asked for the revision of its next write while %s's requests waited: %v", other, greedy, err)
	}
	stop()
}

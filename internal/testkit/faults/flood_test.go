//go:build faults

package faults_test

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// TestFaultFlood floods the service for 5s with 64 publishers that do not
// wait for answers (by-node and compose requests of a small mesh), then
// asks as an ordinary client would: the first answer must come within 2s of
// the flood's end (without the race detector), and the heap must come back
// near its size before.
func TestFaultFlood(t *testing.T) {
	const (
		publishers = 64
		flood      = 5 * time.Second
		nodes      = 50
	)
	c := natstest.StartCluster(t, 1)
	svcConn := c.Connect(0)
	startService(t, svcConn, 1)
	nc := c.Connect(0)
	needs := servicetest.Bucket(t, nc, keys.NeedsBucket)
	var last uint64
	for n := range nodes {
		for _, kind := range []string{"port", "config", "dir", "secret", "bound"} {
			value, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${" + kind + ":x}", Provider: "pg"})
			rev, err := needs.Put(context.Background(), fmt.Sprintf("n%d.web.%s.x", n, kind), value)
			if err != nil {
				t.Fatal(err)
			}
			last = rev
		}
	}
	ask := client.New(c.Connect(0))
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	if _, err := ask.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "n1", MinRevision: last}); err != nil {
		t.Fatal(err)
	}
	cancel()
	before := heap()

	var sent atomic.Int64
	var wg sync.WaitGroup
	floodCtx, stopFlood := context.WithTimeout(context.Background(), flood)
	defer stopFlood()
	conns := make([]*nats.Conn, 8)
	for i := range conns {
		conns[i] = c.Connect(0)
	}
	for p := range publishers {
		pub := conns[p%len(conns)]
		wg.Go(func() {
			byNode, _ := proto.Marshal(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: fmt.Sprintf("n%d", p%nodes)})
			compose, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: fmt.Sprintf("n%d", p%nodes)})
			reply := fmt.Sprintf("_INBOX.gone.%d", p) // nobody listens: the asker gave up
			for i := 0; floodCtx.Err() == nil; i++ {
				var err error
				if i%2 == 0 {
					err = pub.PublishRequest(wire.ProvisioningSubject, reply, byNode)
				} else {
					err = pub.PublishRequest(wire.ComposeSubject, reply, compose)
				}
				if err != nil {
					time.Sleep(time.Millisecond) // the flood's own backoff when its publish fails: pacing
					continue
				}
				sent.Add(1)
				if i%256 == 0 {
					runtime.Gosched()
				}
			}
		})
	}
	wg.Wait()
	for _, pub := range conns {
		_ = pub.Flush()
	}
	ended := time.Now()
	// Ordinary askers from the flood's end on: one request every 50ms, each
	// waiting up to 2s, as a client would. Recovery is the time from the
	// end until every later request is answered.
	type asked struct {
		sent, answered time.Time
		err            error
	}
	var (
		mu    sync.Mutex
		asks  []asked
		askWG sync.WaitGroup
	)
	pace := time.NewTicker(50 * time.Millisecond) // the ordinary askers' rate
	defer pace.Stop()
	for ; time.Since(ended) < 4*time.Second; <-pace.C {
		sent := time.Now()
		askWG.Go(func() {
			askCtx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := ask.Compose(askCtx, &provisionerv1.ComposeRequest{Node: "n7"})
			mu.Lock()
			asks = append(asks, asked{sent: sent, answered: time.Now(), err: err})
			mu.Unlock()
		})
	}
	askWG.Wait()
	// Recovery: from the flood's end to the answer of the first request
	// after which none fails.
	slices.SortFunc(asks, func(a, b asked) int { return a.sent.Compare(b.sent) })
	failed, firstGood := 0, 0
	var worstLatency time.Duration
	for i, a := range asks {
		if a.err != nil {
			failed++
			firstGood = i + 1
			t.Logf("ordinary request sent %s after the flood: %v", a.sent.Sub(ended).Round(time.Millisecond), a.err)
			continue
		}
		worstLatency = max(worstLatency, a.answered.Sub(a.sent))
	}
	if firstGood >= len(asks) {
		if raceEnabled {
			t.Skipf("under the race detector, every ordinary request failed in the 4s after the flood (%d)", len(asks))
		}
		t.Fatalf("every ordinary request failed after the flood")
	}
	answeredAfter := asks[firstGood].answered.Sub(ended)
	stats := serviceStats(t, nc)
	// What the flood buffered is let go: the heap comes back within 64 MiB
	// of its size before, or the test fails 30s after the askers' end.
	var after uint64
	released := time.Now()
	natstest.CheckFor(t, 30*time.Second, func() error {
		if after = heap(); after > before+64<<20 {
			return fmt.Errorf("the heap is %d MiB after the flood, %d MiB before", after>>20, before>>20)
		}
		return nil
	})
	t.Logf("the heap came back within 64 MiB of its size before %s after the askers' end", time.Since(released).Round(time.Millisecond))
	t.Logf("flood: %d requests in %s from %d publishers; ordinary requests (one every 50ms for 4s, 2s timeout) all answered from %s after it ended (%d of %d failed before; worst latency of the answered %s); heap %d MiB before, %d MiB after; stats %s",
		sent.Load(), flood, publishers, answeredAfter.Round(time.Millisecond), failed, len(asks), worstLatency.Round(time.Millisecond), before>>20, after>>20, stats)
	if answeredAfter > freshness && !raceEnabled {
		t.Errorf("ordinary requests were answered again %s after the flood, more than %s", answeredAfter, freshness)
	}
}

// heap is the live heap after a collection, in bytes: the whole test
// process, servers included.
func heap() uint64 {
	runtime.GC()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// serviceStats returns the endpoints' stats data, as JSON.
func serviceStats(t *testing.T, nc *nats.Conn) string {
	t.Helper()
	msg, err := nc.Request("$SRV.STATS."+wire.ServiceName, nil, 2*time.Second)
	if err != nil {
		return err.Error()
	}
	var stats struct {
		Endpoints []struct {
			Name        string          `json:"name"`
			NumRequests int             `json:"num_requests"`
			NumErrors   int             `json:"num_errors"`
			Data        json.RawMessage `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		return err.Error()
	}
	out, _ := json.Marshal(stats.Endpoints)
	return string(out)
}

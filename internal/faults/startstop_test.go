//go:build faults

package faults_test

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/natstest"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// TestFaultStartStopStats starts and stops the service in-process again and
// again while another connection asks $SRV.STATS without pause: with the
// race detector (make test-faults runs this test with -race), any write
// the stats handler can see after micro made it live is reported.
func TestFaultStartStopStats(t *testing.T) {
	cycles := 1000
	if testing.Short() {
		cycles = 100
	}
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{}); err != nil {
		t.Fatal(err)
	}
	// The asker publishes without waiting, so that stats are asked at
	// every moment of a cycle, the one between AddService and the
	// endpoints included.
	asker := natstest.Connect(t, s)
	inbox := nats.NewInbox()
	var answered atomic.Int64
	sub, err := asker.Subscribe(inbox, func(*nats.Msg) { answered.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	done := make(chan struct{})
	var asked atomic.Int64
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(50 * time.Microsecond):
				}
				asked.Add(1)
				_ = asker.PublishRequest("$SRV.STATS."+wire.ServiceName, inbox, nil)
			}
		})
	}
	start := time.Now()
	for range cycles {
		cycleCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		svc, err := service.Start(cycleCtx, service.Config{Conn: nc, Logger: slog.New(slog.DiscardHandler)})
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		svc.Stop()
	}
	close(done)
	wg.Wait()
	t.Logf("%d start/stop cycles in %s, while $SRV.STATS was asked %d times (%d answered)",
		cycles, time.Since(start).Round(time.Millisecond), asked.Load(), answered.Load())
}

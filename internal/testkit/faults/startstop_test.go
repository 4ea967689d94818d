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

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// TestFaultStartStopStats starts and stops the service in-process again and
// again beside a serving instance, so that each adds its endpoints while
// its stats are live (once its copy is loaded), while another connection
// asks its $SRV.STATS without pause: with the race detector (make
// test-faults runs this test with -race), any write the stats handler can
// see is reported. Stats are asked of each instance once Start returned:
// during micro.AddService itself, nats.go's micro writes the service's start
// time after its stats handler is live (micro/service.go, svc.started), a
// race of nats.go's own that this test would otherwise report.
func TestFaultStartStopStats(t *testing.T) {
	cycles := 1000
	if testing.Short() {
		cycles = 100
	}
	s := natstest.Start(t)
	nc := natstest.Connect(t, s)
	servicetest.Buckets(t, nc)
	servicetest.Start(t, natstest.Connect(t, s), func(cfg *service.Config) { cfg.Logger = slog.New(slog.DiscardHandler) })
	// The asker publishes without waiting, so that stats are asked at
	// every moment of a cycle from Start's return, the endpoints'
	// registration included.
	var current atomic.Pointer[string] // the stats subject of the instance started last
	asker := natstest.Connect(t, s)
	inbox := nats.NewInbox()
	var answered atomic.Int64
	sub, err := asker.Subscribe(inbox, func(*nats.Msg) { answered.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	done := make(chan struct{})
	var asked, published atomic.Int64 // counted before and after each publish
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for {
				select {
				case <-done:
					return
				case <-time.After(50 * time.Microsecond):
				}
				if subject := current.Load(); subject != nil {
					asked.Add(1)
					_ = asker.PublishRequest(*subject, inbox, nil)
					published.Add(1)
				}
			}
		})
	}
	start := time.Now()
	for range cycles {
		cycleCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		svc, err := service.Start(cycleCtx, service.Config{Conn: nc, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		subject := "$SRV.STATS." + wire.ServiceName + "." + svc.Info().ID
		current.Store(&subject)
		err = svc.WaitReady(cycleCtx)
		if err != nil {
			cancel()
			t.Fatal(err)
		}
		// Asked after the endpoints are added too: until a request is
		// published that was not yet asked when the instance was ready
		// (more are published than had been asked then).
		askedBefore := asked.Load()
		for published.Load() <= askedBefore {
			select {
			case <-cycleCtx.Done():
				t.Fatal("no $SRV.STATS request was published once the instance was ready")
			case <-time.After(50 * time.Microsecond):
			}
		}
		cancel()
		current.Store(nil)
		svc.Stop()
	}
	close(done)
	wg.Wait()
	t.Logf("%d start/stop cycles in %s, while $SRV.STATS was asked %d times (%d answered)",
		cycles, time.Since(start).Round(time.Millisecond), asked.Load(), answered.Load())
}

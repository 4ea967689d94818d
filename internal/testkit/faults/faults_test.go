//go:build faults

// Package faults_test runs the service against embedded nats-servers while
// faults are injected: NATS restarted, a stream's leader lost gracefully or
// killed, a flood of requests. Run with make test-faults.
package faults_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// freshness is the bound: an acked write is in answers within it.
const freshness = 2 * time.Second

func logger(t *testing.T) *slog.Logger {
	if testing.Verbose() {
		return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo})).With("test", t.Name())
	}
	return slog.New(slog.DiscardHandler)
}

// startService creates the buckets with replicas and runs the service on
// nc; options change its configuration.
func startService(t *testing.T, nc *nats.Conn, replicas int, options ...func(*service.Config)) *service.Service {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := buckets.Ensure(ctx, js, buckets.Config{Replicas: replicas}); err != nil {
		t.Fatal(err)
	}
	return servicetest.Start(t, nc, append([]func(*service.Config){func(cfg *service.Config) { cfg.Logger = logger(t) }}, options...)...)
}

func TestFaultRestart(t *testing.T) {
	for _, tc := range []struct {
		name string
		down func(c *natstest.Cluster)
	}{
		{"graceful", func(c *natstest.Cluster) { c.Stop(0) }},
		{"kill", func(c *natstest.Cluster) { c.Kill(0) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := natstest.StartCluster(t, 1)
			startService(t, c.Connect(0), 1)
			reader := c.Connect(0)
			p := newProbe(t, c.Connect(0), reader, "w")
			// The fault's shape: traffic until writes reach answers, NATS
			// down for 2s, then traffic until 50 writes acked after it is
			// back are in answers, for the figures.
			stop := p.run(20*time.Millisecond, 10*time.Millisecond)
			p.waitWrites(time.Now(), 25, 30*time.Second)
			tc.down(c)
			time.Sleep(2 * time.Second) // the fault's shape: NATS down this long, not a wait for a condition
			c.Start(0)
			back := time.Now()
			p.waitWrites(back, 50, 60*time.Second)
			stop()
			w := p.report("NATS restarted", back)
			t.Logf("the first answer came %s after NATS was back; the first write acked after it was in answers %s after its ack",
				p.firstAnswer(back).Round(time.Millisecond), firstLag(p.lags(), back).Round(time.Millisecond))
			checkLag(t, w, "after NATS was back", back)
			checkCtx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			p.checkCopy(checkCtx, reader)
		})
	}
}

// checkLag fails the test if w, the write acked after from with the worst
// lag, never reached answers (within reflectWithin of the writes' end:
// liveness), or, without the race detector, reached them later than the
// issue's freshness (a speed claim, which -race's slowdown voids: logged
// then by report, not held to).
func checkLag(t *testing.T, w lag, after string, from time.Time) {
	t.Helper()
	switch {
	case w.lag < 0:
		t.Errorf("write %s acked %s %s never reached answers", w.key, w.at.Sub(from).Round(time.Millisecond), after)
	case w.lag > freshness && !raceEnabled:
		t.Errorf("write %s acked %s %s reached answers after %s, more than %s",
			w.key, w.at.Sub(from).Round(time.Millisecond), after, w.lag, freshness)
	}
}

// serviceServer is the server the service connects to first in a cluster.
const serviceServer = 2

func TestFaultLeaderLoss(t *testing.T) {
	needsStream := wire.StreamOf(keys.NeedsBucket)
	for _, tc := range []struct {
		name string
		// victim chooses the server to lose.
		victim func(t *testing.T, c *natstest.Cluster, js jetstream.JetStream) int
		kill   bool
	}{
		{"stream leader, graceful", streamLeader, false},
		{"stream leader, killed", streamLeader, true},
		{"watchers' consumer, killed", consumerHolder, true},
		{"meta leader holding the watchers' consumer, not the stream leader, killed", metaConsumerHolder, true},
		{"service's server, killed", func(*testing.T, *natstest.Cluster, jetstream.JetStream) int { return serviceServer }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := natstest.StartCluster(t, 3)
			startService(t, c.Connect(serviceServer), 3)
			admin := c.Connect(1)
			js, err := jetstream.New(admin)
			if err != nil {
				t.Fatal(err)
			}
			c.WaitStreamLeader(needsStream, 10*time.Second)
			victim := tc.victim(t, c, js)
			other := (victim + 1) % 3 // the writer's and reader's server
			reader := c.Connect(other)
			p := newProbe(t, c.Connect(other), reader, "w")
			// The fault's shape: traffic until writes reach answers, the
			// server lost, then traffic until 50 writes acked after the
			// election are in answers, for the figures.
			stop := p.run(20*time.Millisecond, 10*time.Millisecond)
			p.waitWrites(time.Now(), 25, 30*time.Second)
			lost := time.Now()
			if tc.kill {
				c.Kill(victim)
			} else {
				c.Stop(victim)
			}
			leader := c.WaitStreamLeader(needsStream, 20*time.Second)
			elected := time.Now()
			p.waitWrites(elected, 50, 60*time.Second)
			stop()
			t.Logf("lost server %d; the stream had a new leader (server %d) %s later", victim, leader, elected.Sub(lost).Round(time.Millisecond))
			w := p.report("leader lost", lost)
			checkLag(t, w, "after the fault", lost)
			c.Start(victim)
			c.WaitMetaLeader(30 * time.Second)
			c.WaitStreamLeader(needsStream, 30*time.Second)
			checkCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			p.checkCopy(checkCtx, reader)
		})
	}
}

func streamLeader(t *testing.T, c *natstest.Cluster, _ jetstream.JetStream) int {
	return c.WaitStreamLeader(wire.StreamOf(keys.NeedsBucket), 10*time.Second)
}

// consumerHolder is the server that holds the needs watcher's consumer.
func consumerHolder(t *testing.T, c *natstest.Cluster, js jetstream.JetStream) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	holders, err := c.ConsumerHolders(ctx, js, wire.StreamOf(keys.NeedsBucket))
	if err != nil || len(holders) == 0 {
		t.Fatalf("the needs bucket's consumers: %v %v", holders, err)
	}
	return holders[0]
}

// metaConsumerHolder returns JetStream's meta leader once it holds the
// needs watcher's consumer and is not the needs stream's leader: the
// stream's leader is moved away, and the watcher's consumer deleted until
// the watcher's next one is placed there. Killing it loses the watcher's
// consumer while writes go on being acked, and a new consumer waits for a
// new meta leader.
func metaConsumerHolder(t *testing.T, c *natstest.Cluster, js jetstream.JetStream) int {
	t.Helper()
	victim := c.WaitMetaLeader(10 * time.Second)
	stream := wire.StreamOf(keys.NeedsBucket)
	if c.StreamLeader(stream) == victim {
		c.MoveStreamLeader(js.Conn(), stream, (victim+1)%3)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := js.Stream(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	natstest.CheckFor(t, 30*time.Second, func() error {
		holders, err := c.ConsumerHolders(ctx, js, stream)
		switch {
		case err != nil:
			return err
		case slices.Contains(holders, victim):
			return nil
		case len(holders) == 0:
			return errors.New("the watcher has not made its next consumer yet")
		}
		for name := range s.ConsumerNames(ctx).Name() {
			_ = s.DeleteConsumer(ctx, name)
		}
		return fmt.Errorf("the watcher's consumers were on %v, not on the meta leader %d: deleted, for its next one", holders, victim)
	})
	return victim
}

// firstLag is the lag of the first write acked at or after from.
func firstLag(lags []lag, from time.Time) time.Duration {
	for _, l := range lags {
		if !l.at.Before(from) {
			return l.lag
		}
	}
	return -1
}

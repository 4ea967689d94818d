package seat

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// startCluster runs three embedded nats-servers with JetStream joined by
// routes, and returns them once JetStream answers on the cluster.
func startCluster(t *testing.T) []*server.Server {
	t.Helper()
	var ports []int
	for range 3 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		_ = l.Close()
	}
	var routes []*url.URL
	for _, p := range ports {
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	var servers []*server.Server
	for i := range 3 {
		opts := &server.Options{
			ServerName: fmt.Sprintf("n%d", i),
			Host:       "127.0.0.1",
			Port:       -1,
			JetStream:  true,
			StoreDir:   t.TempDir(),
			NoLog:      true,
			NoSigs:     true,
			Cluster:    server.ClusterOpts{Name: "mesh", Host: "127.0.0.1", Port: ports[i]},
			Routes:     routes,
		}
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		go s.Start()
		t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
		servers = append(servers, s)
	}
	for _, s := range servers {
		if !s.ReadyForConnections(30 * time.Second) {
			t.Fatal("server not ready")
		}
	}
	return servers
}

// TestSeatOnAThreeServerCluster: the registry's stream replicated on three
// servers; a seat on each. The holder's server dies: a standby on another
// server takes the seat, and its fenced writes go through once
// the stream has a leader again.
func TestSeatOnAThreeServerCluster(t *testing.T) {
	t.Parallel()
	servers := startCluster(t)
	nc, err := nats.Connect(servers[0].ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, _ := jetstream.New(nc)
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	natstest.CheckFor(t, 30*time.Second, func() error { // the meta leader may be being elected
		actx, acancel := context.WithTimeout(ctx, 5*time.Second)
		defer acancel()
		return buckets.Ensure(actx, js, buckets.Config{Replicas: 3})
	})

	cfg := Config{TTL: 3 * time.Second, Poll: 100 * time.Millisecond}
	var ins []*instance
	for _, s := range servers {
		ins = append(ins, campaign(t, s.ClientURL(), cfg))
	}
	holder, _ := waitForOneHolder(t, ins, 15*time.Second)
	var at int
	for i, in := range ins {
		if in == holder {
			at = i
		}
	}
	// Fenced writes by the holder go through on the replicated stream.
	for i := range 5 {
		if _, err := holder.seat.PublishMsg(ctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port"), Data: fmt.Appendf(nil, "v%d", i)}); err != nil {
			t.Fatalf("fenced write %d: %v", i, err)
		}
	}

	holder.seat.mu.Lock()
	heldRev := holder.seat.rev
	holder.seat.mu.Unlock()

	// The holder's server dies, and the holder with it.
	servers[at].Shutdown()
	holder.nc.Close()
	start := time.Now()
	next, took := waitForOneHolder(t, without(ins, holder), 20*time.Second)
	// The figure is logged: under -race on a busy machine it stretches; the
	// wait's 20s is the bound.
	t.Logf("the holder's server died: a standby took the seat after %s (TTL %s)", took, cfg.TTL)
	// Its fenced writes go through once the stream has a leader again; a
	// refusal by the fence fails at once.
	natstest.CheckFor(t, 10*time.Second, func() error {
		wctx, wcancel := context.WithTimeout(ctx, 2*time.Second)
		defer wcancel()
		_, err := next.seat.PublishMsg(wctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port"), Data: []byte("next")})
		if errors.Is(err, ErrNotHeld) {
			t.Fatalf("the new holder's fenced write %s after takeover: %v", time.Since(start), err)
		}
		return err
	})

	// The former holder wakes up, on a surviving server, still holding
	// its lease: its write is refused by the replicated stream.
	survivor := servers[(at+1)%3]
	snc, err := nats.Connect(survivor.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(snc.Close)
	sjs, _ := jetstream.New(snc)
	stalled, err := New(ctx, Config{JS: sjs, ID: holder.seat.ID(), Logger: quiet()})
	if err != nil {
		t.Fatal(err)
	}
	stalled.held, stalled.rev = true, heldRev
	_, err = stalled.PublishMsg(ctx, &nats.Msg{Subject: wire.KVSubject(keys.RegistryBucket, "port"), Data: []byte("stale")})
	if !errors.Is(err, ErrFenced) {
		t.Errorf("the former holder's write on the cluster: %v, want ErrFenced", err)
	}
}

package natstest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Cluster is a fault harness: n embedded nats-servers with JetStream, each
// with its own store directory, joined by routes when n > 1. Clients reach
// server i through a proxy at a fixed address (URL, URLs), and the servers
// reach each other through a proxy per direction, so that a server can be
// stopped gracefully (Stop, Restart: SIGTERM, leaders stepping down) or
// killed (Kill: every connection to and from it reset before it goes, as
// with SIGKILL), and started again on the same store.
type Cluster struct {
	t testing.TB
	n int
	// configure, if set, changes each server's options as it starts.
	configure func(*server.Options)
	dirs      []string
	clients   []*link   // clients -> server i
	routes    [][]*link // routes[i][j]: server i -> server j

	mu      sync.Mutex
	servers []*server.Server // nil while down
}

// StartCluster starts n servers and waits until JetStream has a meta leader
// (n > 1) or is ready (n == 1). Everything stops when the test ends.
// configure, if given, changes each server's options each time it starts
// (its accounts' subject mappings, say).
func StartCluster(t testing.TB, n int, configure ...func(*server.Options)) *Cluster {
	t.Helper()
	c := &Cluster{t: t, n: n, servers: make([]*server.Server, n), routes: make([][]*link, n)}
	if len(configure) > 0 {
		c.configure = configure[0]
	}
	for i := range n {
		c.dirs = append(c.dirs, t.TempDir())
		c.clients = append(c.clients, newLink(t, ""))
		c.routes[i] = make([]*link, n)
		for j := range n {
			if j != i {
				c.routes[i][j] = newLink(t, "")
			}
		}
	}
	t.Cleanup(func() {
		for i := range n {
			c.shutdown(i)
		}
	})
	for i := range n {
		c.Start(i)
	}
	c.WaitMetaLeader(30 * time.Second)
	return c
}

// Len is the number of servers.
func (c *Cluster) Len() int { return c.n }

// URL is the client URL of server i.
func (c *Cluster) URL(i int) string { return "nats://" + c.clients[i].addr() }

// URLs lists every server's client URL, server first first, for
// nats.Connect.
func (c *Cluster) URLs(first int) string {
	urls := []string{c.URL(first)}
	for i := range c.n {
		if i != first {
			urls = append(urls, c.URL(i))
		}
	}
	return strings.Join(urls, ",")
}

// Server returns server i, or nil while it is down.
func (c *Cluster) Server(i int) *server.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.servers[i]
}

// Name is server i's name, as JetStream's cluster information gives it.
func (c *Cluster) Name(i int) string { return "s" + strconv.Itoa(i) }

// Index returns the index of the server named name, or -1.
func (c *Cluster) Index(name string) int {
	for i := range c.n {
		if c.Name(i) == name {
			return i
		}
	}
	return -1
}

// Start starts server i (again) on its store directory and heals its
// links.
func (c *Cluster) Start(i int) {
	c.t.Helper()
	opts := &server.Options{
		ServerName: c.Name(i),
		Host:       "127.0.0.1",
		Port:       -1,
		JetStream:  true,
		StoreDir:   c.dirs[i],
		NoLog:      true,
		NoSigs:     true,
	}
	if c.n > 1 {
		opts.Cluster = server.ClusterOpts{Name: "faults", Host: "127.0.0.1", Port: -1, NoAdvertise: true}
		for j := range c.n {
			if j != i {
				opts.Routes = append(opts.Routes, server.RoutesFromStr("nats://"+c.routes[i][j].addr())...)
			}
		}
	}
	if c.configure != nil {
		c.configure(opts)
	}
	s, err := server.NewServer(opts)
	if err != nil {
		c.t.Fatalf("nats-server %d: %v", i, err)
	}
	s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		c.t.Fatalf("nats-server %d did not become ready in 10s", i)
	}
	c.mu.Lock()
	c.servers[i] = s
	c.mu.Unlock()
	c.clients[i].setTarget(s.Addr().String())
	for j := range c.n {
		if j == i {
			continue
		}
		c.routes[j][i].setTarget(s.ClusterAddr().String())
		c.routes[i][j].setCut(false)
		c.routes[j][i].setCut(false)
	}
	c.clients[i].setCut(false)
}

// Stop stops server i gracefully, as SIGTERM does: its leaders step down
// and its clients are told.
func (c *Cluster) Stop(i int) {
	c.t.Helper()
	c.shutdown(i)
}

// Kill stops server i abruptly, as SIGKILL does: every connection to and
// from it is reset first, so that nothing it says on its way down reaches
// anyone.
func (c *Cluster) Kill(i int) {
	c.t.Helper()
	c.clients[i].setCut(true)
	for j := range c.n {
		if j != i {
			c.routes[i][j].setCut(true)
			c.routes[j][i].setCut(true)
		}
	}
	c.shutdown(i)
}

// Restart stops server i gracefully, waits down, and starts it again.
func (c *Cluster) Restart(i int, down time.Duration) {
	c.t.Helper()
	c.Stop(i)
	time.Sleep(down) // the fault's shape: down this long
	c.Start(i)
}

func (c *Cluster) shutdown(i int) {
	c.mu.Lock()
	s := c.servers[i]
	c.servers[i] = nil
	c.mu.Unlock()
	if s == nil {
		return
	}
	s.Shutdown()
	s.WaitForShutdown()
	c.clients[i].setTarget("")
	for j := range c.n {
		if j != i {
			c.routes[j][i].setTarget("")
		}
	}
}

// WaitMetaLeader waits until a running server is JetStream's meta leader
// (or, alone, has JetStream ready), and returns its index.
func (c *Cluster) WaitMetaLeader(timeout time.Duration) int {
	c.t.Helper()
	leader := -1
	CheckFor(c.t, timeout, func() error {
		for i := range c.n {
			s := c.Server(i)
			if s == nil {
				continue
			}
			if c.n == 1 && s.JetStreamEnabled() || c.n > 1 && s.JetStreamIsLeader() && c.allCurrent() {
				leader = i
				return nil
			}
		}
		return errors.New("no JetStream meta leader")
	})
	return leader
}

// allCurrent reports whether every running server is current with the
// meta leader, and the leader knows them all.
func (c *Cluster) allCurrent() bool {
	running := 0
	for i := range c.n {
		s := c.Server(i)
		if s == nil {
			continue
		}
		running++
		if !s.JetStreamIsCurrent() {
			return false
		}
		if s.JetStreamIsLeader() && len(s.JetStreamClusterPeers()) < c.n {
			return false
		}
	}
	return running > 0
}

// StreamLeader returns the index of the server leading stream in the
// global account, or -1 when none does.
func (c *Cluster) StreamLeader(stream string) int {
	for i := range c.n {
		s := c.Server(i)
		if s == nil {
			continue
		}
		if c.n == 1 || s.JetStreamIsStreamLeader(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
			return i
		}
	}
	return -1
}

// WaitStreamCurrent waits until every running server's replica of stream
// is current with its leader: a server started again has caught up, and can
// vote in the stream's next election as one that never left.
func (c *Cluster) WaitStreamCurrent(stream string, timeout time.Duration) {
	c.t.Helper()
	CheckFor(c.t, timeout, func() error {
		for i := range c.n {
			if s := c.Server(i); s != nil && !s.JetStreamIsStreamCurrent(server.DEFAULT_GLOBAL_ACCOUNT, stream) {
				return fmt.Errorf("%s's replica of stream %s is not current", c.Name(i), stream)
			}
		}
		return nil
	})
}

// WaitStreamLeader waits until stream has a leader, and returns its index.
func (c *Cluster) WaitStreamLeader(stream string, timeout time.Duration) int {
	c.t.Helper()
	leader := -1
	CheckFor(c.t, timeout, func() error {
		if leader = c.StreamLeader(stream); leader < 0 {
			return fmt.Errorf("stream %s has no leader", stream)
		}
		return nil
	})
	return leader
}

// ConsumerHolders returns the indexes of the servers that lead a consumer
// of stream, read through js.
func (c *Cluster) ConsumerHolders(ctx context.Context, js jetstream.JetStream, stream string) ([]int, error) {
	s, err := js.Stream(ctx, stream)
	if err != nil {
		return nil, err
	}
	var holders []int
	list := s.ListConsumers(ctx)
	for info := range list.Info() {
		if info.Cluster == nil {
			holders = append(holders, 0)
			continue
		}
		if i := c.Index(info.Cluster.Leader); i >= 0 {
			holders = append(holders, i)
		}
	}
	return holders, list.Err()
}

// Connect opens a connection to the cluster, server first first, that
// reconnects quickly to any of them and only to the harness's addresses;
// it is closed when the test ends.
func (c *Cluster) Connect(first int, opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	opts = append([]nats.Option{
		quietSlowConsumers,
		nats.MaxReconnects(-1),
		nats.ReconnectWait(100 * time.Millisecond),
		nats.ReconnectJitter(100*time.Millisecond, 100*time.Millisecond),
		nats.IgnoreDiscoveredServers(),
		nats.DontRandomize(),
		nats.Timeout(time.Second),
	}, opts...)
	nc, err := nats.Connect(c.URLs(first), opts...)
	if err != nil {
		c.t.Fatalf("connect to %s: %v", c.URLs(first), err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// ServerOf returns the index of the server nc is connected to, or -1.
func (c *Cluster) ServerOf(nc *nats.Conn) int {
	url := nc.ConnectedUrl()
	for i := range c.n {
		if url == c.URL(i) {
			return i
		}
	}
	return -1
}

// MoveMetaLeader asks JetStream's meta leader to hand its leadership to
// server to, and waits until it has.
func (c *Cluster) MoveMetaLeader(nc *nats.Conn, to int) {
	c.t.Helper()
	if c.Server(to).JetStreamIsLeader() {
		return
	}
	c.stepdown(nc, "$JS.API.META.LEADER.STEPDOWN", to)
	CheckFor(c.t, 10*time.Second, func() error {
		if !c.Server(to).JetStreamIsLeader() {
			return fmt.Errorf("server %d is not the meta leader", to)
		}
		return nil
	})
}

// MoveStreamLeader asks stream's leader to hand its leadership to server
// to, and waits until it has.
func (c *Cluster) MoveStreamLeader(nc *nats.Conn, stream string, to int) {
	c.t.Helper()
	if c.StreamLeader(stream) == to {
		return
	}
	c.stepdown(nc, "$JS.API.STREAM.LEADER.STEPDOWN."+stream, to)
	CheckFor(c.t, 10*time.Second, func() error {
		if c.StreamLeader(stream) != to {
			return fmt.Errorf("server %d is not the leader of %s", to, stream)
		}
		return nil
	})
}

func (c *Cluster) stepdown(nc *nats.Conn, subject string, to int) {
	c.t.Helper()
	body, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": c.Name(to)}})
	msg, err := nc.Request(subject, body, 5*time.Second)
	if err != nil {
		c.t.Fatalf("%s: %v", subject, err)
	}
	var res struct {
		Error *struct {
			Description string `json:"description"`
		} `json:"error"`
	}
	if err := json.Unmarshal(msg.Data, &res); err != nil || res.Error != nil {
		c.t.Fatalf("%s: %s %v", subject, msg.Data, err)
	}
}

package natstest

import (
	"errors"
	"io"
	"net"
	"sync"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// link is a TCP proxy on a loopback port to a target that may move (a
// restarted server listens on a new port). Cutting it closes every
// connection through it at once, and refuses new ones until it is healed:
// from either end, the other end vanished without a word, as when a process
// is killed with SIGKILL or the network fails.
type link struct {
	listener net.Listener

	mu     sync.Mutex
	target string
	cut    bool
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

func newLink(t testing.TB, target string) *link {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	l := &link{listener: ln, target: target, conns: map[net.Conn]struct{}{}}
	l.wg.Go(l.accept)
	t.Cleanup(l.close)
	return l
}

// addr is where the link listens.
func (l *link) addr() string { return l.listener.Addr().String() }

func (l *link) accept() {
	for {
		in, err := l.listener.Accept()
		if err != nil {
			return
		}
		l.mu.Lock()
		target, cut := l.target, l.cut
		l.mu.Unlock()
		if cut || target == "" {
			_ = in.Close()
			continue
		}
		out, err := net.Dial("tcp", target)
		if err != nil {
			_ = in.Close()
			continue
		}
		if !l.track(in, out) {
			continue
		}
		l.wg.Go(func() { l.pipe(in, out) })
		l.wg.Go(func() { l.pipe(out, in) })
	}
}

// track records a proxied pair, unless the link was cut meanwhile.
func (l *link) track(in, out net.Conn) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.cut {
		_ = in.Close()
		_ = out.Close()
		return false
	}
	l.conns[in] = struct{}{}
	l.conns[out] = struct{}{}
	return true
}

func (l *link) pipe(dst, src net.Conn) {
	_, err := io.Copy(dst, src)
	if err != nil && !errors.Is(err, net.ErrClosed) {
		_ = err // a cut or a closed end: both sides are closed below
	}
	_ = dst.Close()
	_ = src.Close()
	l.mu.Lock()
	delete(l.conns, dst)
	delete(l.conns, src)
	l.mu.Unlock()
}

// setTarget points new connections at target.
func (l *link) setTarget(target string) {
	l.mu.Lock()
	l.target = target
	l.mu.Unlock()
}

// setCut cuts the link (closing every connection through it) or heals it.
func (l *link) setCut(cut bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.cut = cut
	if !cut {
		return
	}
	for c := range l.conns {
		if tc, ok := c.(*net.TCPConn); ok {
			_ = tc.SetLinger(0) // a reset, as from a dead process's kernel
		}
		_ = c.Close()
	}
	clear(l.conns)
}

func (l *link) close() {
	_ = l.listener.Close()
	l.setCut(true)
	l.wg.Wait()
}

// A Proxy is a TCP proxy to one server for a test, which it cuts (every
// connection through it closed at once, new ones refused) and heals: a
// client connected through it loses the server and finds it again, while
// the test's other connections keep theirs.
type Proxy struct{ link *link }

// NewProxy starts a proxy to s, closed when the test ends.
func NewProxy(t testing.TB, s *server.Server) *Proxy {
	t.Helper()
	return &Proxy{link: newLink(t, s.Addr().String())}
}

// URL is the proxy's client URL.
func (p *Proxy) URL() string { return "nats://" + p.link.addr() }

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() { p.link.setCut(true) }

// Heal takes connections again.
func (p *Proxy) Heal() { p.link.setCut(false) }

package ops

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/novox/mesh-provisioner/service"
)

// Config holds what Start needs.
type Config struct {
	// Addr is the host:port to listen on, such as 127.0.0.1:9090; an empty
	// host (":9090") is 127.0.0.1, so that every interface is only ever
	// asked for by name (0.0.0.0:9090, [::]:9090). Required.
	Addr string
	// Token is the bearer token the page, the node views and /metrics ask
	// for (ReadTokenFile reads it); with none they answer 403 to everyone.
	// /healthz and /readyz ask for nothing.
	Token []byte
	// Hosts are the names the server answers to, as a request's Host header
	// gives them (without the port): a request for another is refused (421)
	// on every path but /healthz and /readyz, so that a page on another site
	// cannot read this one by rebinding its DNS name here. Nil means
	// DefaultHosts(Addr).
	Hosts []string
	// Logger receives the server's logs; nil means slog.Default().
	Logger *slog.Logger
	// Refresh is how often the status page reloads itself; zero means 5s.
	Refresh time.Duration
	// DiscoveryWait is how long the page collects the instances' discovery
	// replies; zero means 250ms.
	DiscoveryWait time.Duration
	// ComposeNodes is how many nodes (the first by name) the page composes
	// to count their refusals and provisions; zero means 50.
	ComposeNodes int
	// Timeout bounds what a page, a composition or a scrape asks of NATS;
	// zero means 5s.
	Timeout time.Duration
	// Version is the version micro discovery shows (serve's buildVersion),
	// which /metrics reports in mesh_provisioner_build_info; empty reports
	// "unknown".
	Version string
}

// Service is what the server reports on: *service.Service satisfies it.
type Service interface {
	// Stats is the micro service's statistics, as $SRV.STATS reports them.
	Stats() micro.Stats
	// Copies is the state of each bucket's copy.
	Copies() []service.CopyState
	// Ready is nil while the service answers right, or says why not.
	Ready() error
}

// Target is the running service and the connections it depends on.
type Target struct {
	Service Service
	// Conns are the connections the service needs: it is ready only while
	// each is connected.
	Conns []*nats.Conn
	// Ask is the connection the page asks discovery, the verbs and the
	// streams' information on: an operator's identity
	// (permissions.Operator), or any that may ask them.
	Ask *nats.Conn
	// Read is the connection /metrics reads the buckets' last revisions on,
	// by direct get: the server's writing identity may. The page reads the
	// registry's last write on it too.
	Read *nats.Conn
	// AskAs names Ask's identity in the page's sentence when NATS refuses
	// it, such as "the answering identity"; empty: the connection's name.
	AskAs string
}

// Server is the operator's HTTP server.
type Server struct {
	cfg      Config
	logger   *slog.Logger
	access   *access
	listener net.Listener
	http     *http.Server
	served   chan struct{}

	registry *prometheus.Registry
	latency  *prometheus.HistogramVec
	refused  *prometheus.CounterVec // permission violations, by identity

	mu       sync.RWMutex
	target   *Target
	stopping atomic.Bool

	// looks is what the status page remembers between its looks (page.go).
	looks looks
}

// ErrAddrInUse is returned by Start when the address is taken.
var ErrAddrInUse = errors.New("the address is in use")

// Start listens on cfg.Addr and serves until ctx is done or Close is
// called. Once ctx is done /readyz answers 503 ("stopping"), while the
// other paths keep answering until Close.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	if cfg.Addr == "" {
		return nil, errors.New("ops: Config.Addr is required")
	}
	addr, err := listenAddr(cfg.Addr)
	if err != nil {
		return nil, err
	}
	if cfg.Hosts == nil {
		cfg.Hosts = DefaultHosts(addr)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.Refresh <= 0 {
		cfg.Refresh = 5 * time.Second
	}
	if cfg.DiscoveryWait <= 0 {
		cfg.DiscoveryWait = 250 * time.Millisecond
	}
	if cfg.ComposeNodes <= 0 {
		cfg.ComposeNodes = 50
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 5 * time.Second
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return nil, fmt.Errorf("--http %s: %w", addr, ErrAddrInUse)
		}
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
	guard := newAccess(cfg.Token, cfg.Hosts)
	cfg.Token = nil // kept only as the guard's digest
	s := &Server{cfg: cfg, logger: cfg.Logger, access: guard, listener: ln, served: make(chan struct{})}
	s.initMetrics()
	s.http = &http.Server{Handler: s.routes(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	go func() {
		defer close(s.served)
		if err := s.http.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.logger.Error("the HTTP server stopped", "addr", ln.Addr().String(), "err", err)
		}
	}()
	context.AfterFunc(ctx, func() { s.stopping.Store(true) })
	s.logger.Info("HTTP server listening: /healthz, /readyz, /metrics and the status page at /", "url", s.URL(),
		"hosts", cfg.Hosts, "page_and_metrics", s.access.describe())
	return s, nil
}

// listenAddr is addr with an empty host made 127.0.0.1: the page is opened
// to every interface only when that is asked for by name.
func listenAddr(addr string) (string, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "", fmt.Errorf("--http %q: want host:port, such as 127.0.0.1:9090 (0.0.0.0:9090 for every interface): %w", addr, err)
	}
	if host == "" {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port), nil
}

// routes serves the probes to anyone, and every other path (the page, the
// node views, /metrics, and a 404 or 405 for anything else) only past the
// access guard.
func (s *Server) routes() http.Handler {
	guarded := http.NewServeMux()
	guarded.Handle("GET /metrics", s.metricsHandler())
	guarded.HandleFunc("GET /{$}", s.page)
	guarded.HandleFunc("GET /nodes/{node}/compose", s.compose)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", s.healthz)
	mux.HandleFunc("GET /readyz", s.readyz)
	mux.Handle("/", s.access.guard(guarded))
	return mux
}

// URL is the server's base URL, such as http://127.0.0.1:9090.
func (s *Server) URL() string { return "http://" + s.listener.Addr().String() }

// Attach hands the server the running service: /readyz, /metrics and the
// page report on it from now on. On a nil server (no --http) it does
// nothing.
func (s *Server) Attach(t Target) {
	if s == nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.target = &t
}

// current returns the attached target, or nil.
func (s *Server) current() *Target {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.target
}

// Observer returns the hook that measures the service's answers, for
// service.Config.Observe; nil on a nil server (no --http).
func (s *Server) Observer() service.Observer {
	if s == nil {
		return nil
	}
	return s.observe
}

// Close stops the server: requests in progress get up to 2s to finish,
// even when ctx is done already (as it is when serve stops).
func (s *Server) Close(ctx context.Context) {
	if s == nil {
		return
	}
	s.stopping.Store(true)
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := s.http.Shutdown(ctx); err != nil {
		_ = s.http.Close()
	}
	<-s.served
}

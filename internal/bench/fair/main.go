// Command fair (internal/bench/fair, formerly benchfair) measures what one node can do to another with its own
// grant (issue 37), each figure against the quiet one in the same run:
//
//   - flood: node ace publishes compose requests on its own subject,
//     open-loop, as fast as one process can, answers never read, while node
//     bob asks his own compose -rate times a second: bob's answers lost and
//     his p50/p99 against the same asks with ace quiet;
//
//   - churn: ace rewrites its own needs through the put verb as fast as its
//     grant allows (-churners puts in flight), while bob asks his compose
//     and writes a need of his, timing his plan's new digest heard
//     (client.WatchPlan): both p99s against the quiet ones.
//
// The nats-server runs in a process of its own, its users the generated
// permission sets (the service's two identities, ace, bob, operator alice);
// the service is the built binary (-bin), and ace is a third process. The
// service's log lines in each phase are counted, and its stats (as alice)
// printed after the flood.
//
//	go run ./internal/bench/fair -bin bin/mesh-provisioner
//
// Machines are small and noisy: read the ratios, not the absolute figures.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/bench/benchnats"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/wire"
)

type config struct {
	bin, serveFlags  string
	asks             int
	rate             float64
	modules, needs   int
	churners         int
	publishers       int
	timeout          time.Duration
	attack, attackAt string
	attackFor        time.Duration
	partitions       int
}

func main() {
	var cfg config
	flag.StringVar(&cfg.bin, "bin", "bin/mesh-provisioner", "the service's binary")
	flag.StringVar(&cfg.serveFlags, "serve-flags", "", "more flags of the service's serve, space-separated (\"--max-rate-per-asker 1000\")")
	flag.IntVar(&cfg.asks, "asks", 50, "bob's asks in each phase")
	flag.Float64Var(&cfg.rate, "rate", 10, "bob's asks a second")
	flag.IntVar(&cfg.modules, "modules", 10, "modules of each node")
	flag.IntVar(&cfg.needs, "needs", 3, "needs of each module")
	flag.IntVar(&cfg.churners, "churners", 64, "ace's puts in flight while it churns")
	flag.IntVar(&cfg.partitions, "partitions", 8, "partitions of the mesh (serve --partitions; ace and bob in two of them); 0: unpartitioned")
	flag.IntVar(&cfg.publishers, "publishers", 2, "ace's goroutines publishing the flood, on one connection")
	flag.DurationVar(&cfg.timeout, "timeout", 2*time.Second, "how long bob waits for an answer before counting it lost (nats.go's default)")
	flag.StringVar(&cfg.attack, "attack", "", "internal: be ace, attacking (flood or churn) at -attack-url for -attack-for")
	flag.StringVar(&cfg.attackAt, "attack-url", "", "internal: ace's URL")
	flag.DurationVar(&cfg.attackFor, "attack-for", 0, "internal: how long ace attacks")
	natsOnly := flag.String(benchnats.Flag, "", "internal: run only a nats-server with its store (and configuration) in this directory, print its URL, and serve until stdin closes")
	flag.Parse()
	var err error
	switch {
	case *natsOnly != "":
		err = benchnats.Serve(*natsOnly)
	case cfg.attack != "":
		err = attack(cfg)
	default:
		err = run(cfg)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "benchfair:", err)
		os.Exit(1)
	}
}

// identities are the users of the bench's nats-server, each with the
// permission set `mesh-provisioner permissions` prints for it, in a mesh
// of partitions partitions.
func identities(partitions int) (map[string]permissions.Permissions, error) {
	writer, err := permissions.ServerWriter()
	if err != nil {
		return nil, err
	}
	grants := map[string]permissions.Permissions{wire.ServerIdentity: permissions.Server(), wire.WriterIdentity: writer}
	for _, node := range []string{"ace", "bob"} {
		if grants[node], err = permissions.Node(node); err != nil {
			return nil, err
		}
		grants[node] = grants[node].Partitioned(partitions)
	}
	if grants["alice"], err = permissions.Operator("alice"); err != nil {
		return nil, err
	}
	return grants, nil
}

func serverConfig(grants map[string]permissions.Permissions, partitions int) string {
	var b strings.Builder
	b.WriteString(permissions.MappingsConfig(partitions) + "\n")
	b.WriteString("authorization {\n  users = [\n")
	for _, name := range slices.Sorted(maps.Keys(grants)) {
		fmt.Fprintf(&b, "    { user: %q, password: %q, permissions: %s }\n", name, name+"-secret", grants[name].Config())
	}
	b.WriteString("  ]\n}\n")
	return b.String()
}

// userURL is base with name's user and password.
func userURL(base, name string) string {
	u, err := url.Parse(base)
	if err != nil {
		return base
	}
	u.User = url.UserPassword(name, name+"-secret")
	return u.String()
}

func run(cfg config) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "benchfair")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	if cfg.partitions > 1 && wire.PartitionOf("ace", cfg.partitions) == wire.PartitionOf("bob", cfg.partitions) {
		return fmt.Errorf("-partitions %d puts ace and bob in one partition: choose another count", cfg.partitions)
	}
	grants, err := identities(cfg.partitions)
	if err != nil {
		return err
	}
	base, stopNATS, err := benchnats.StartWith(dir, serverConfig(grants, cfg.partitions))
	if err != nil {
		return err
	}
	defer stopNATS()

	logFile := filepath.Join(dir, "serve.log")
	serveFlags := strings.Fields(cfg.serveFlags)
	if cfg.partitions > 1 {
		serveFlags = append(serveFlags, "--partitions", strconv.Itoa(cfg.partitions))
	}
	stopService, err := startService(cfg.bin, serveFlags, base, logFile)
	if err != nil {
		return err
	}
	defer stopService()

	bob, err := connectNode(base, "bob")
	if err != nil {
		return err
	}
	defer bob.nc.Close()
	ace, err := connectNode(base, "ace")
	if err != nil {
		return err
	}
	if err := waitServing(ctx, bob); err != nil {
		return err
	}
	for _, n := range []*node{bob, ace} {
		if err := n.writeNeeds(ctx, cfg.modules, cfg.needs, 0); err != nil {
			return err
		}
	}
	ace.nc.Close()
	alice, err := nats.Connect(userURL(base, "alice"), client.Inbox(wire.RoleOperator, "alice"))
	if err != nil {
		return err
	}
	defer alice.Close()

	// bob's plan watch runs through every phase; each of his writes waits
	// for its new digest.
	heard := make(chan *provisionerv1.ComposeResponse, 16)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go func() {
		_ = bob.client.WatchPlan(watchCtx, "bob", func(c *provisionerv1.ComposeResponse) error {
			select {
			case heard <- c:
			default:
			}
			return nil
		})
	}()
	select {
	case <-heard: // the first composition
	case <-time.After(10 * time.Second):
		return errors.New("bob's plan watch composed nothing in 10s")
	}

	logLines := func() int {
		data, _ := os.ReadFile(logFile)
		return bytes.Count(data, []byte("\n"))
	}
	var rows []row
	phase := func(name, attackKind string, withPlans bool) error {
		var stopAttack func() (string, error)
		if attackKind != "" {
			span := time.Duration(float64(cfg.asks)/cfg.rate*float64(time.Second))*2 + 6*time.Second
			if stopAttack, err = startAttack(attackKind, userURL(base, "ace"), span, cfg); err != nil {
				return err
			}
			time.Sleep(time.Second) // the attack's ramp: pacing, not a wait for a condition
		}
		lines := logLines()
		r := row{phase: name}
		r.compose = bob.askCompose(ctx, cfg)
		if withPlans {
			r.plans = bob.pushes(ctx, cfg, heard)
		}
		r.logLines = logLines() - lines
		if stopAttack != nil {
			if r.attacker, err = stopAttack(); err != nil {
				return err
			}
		}
		r.stats = composeStats(alice)
		rows = append(rows, r)
		return nil
	}
	for _, p := range []struct {
		name, attack string
		plans        bool
	}{
		{"quiet", "", true},
		{"ace floods", "flood", false},
		{"quiet again", "", true},
		{"ace churns", "churn", true},
	} {
		if err := phase(p.name, p.attack, p.plans); err != nil {
			return err
		}
	}
	report(cfg, rows)
	return nil
}

// row is one phase's figures.
type row struct {
	phase           string
	compose, plans  latencies
	attacker, stats string
	logLines        int
}

func report(cfg config, rows []row) {
	fmt.Printf("bob: %d asks at %.0f/s (timeout %s) per phase; nodes of %d x %d; service %s %s\n\n", cfg.asks, cfg.rate, cfg.timeout, cfg.modules, cfg.needs, cfg.bin, cfg.serveFlags)
	fmt.Printf("%-12s | %-34s | %-34s | %-9s | %s\n", "phase", "bob's compose: lost, p50, p99", "bob's plan pushed: lost, p50, p99", "log lines", "ace")
	quiet := rows[0]
	for _, r := range rows {
		fmt.Printf("%-12s | %-34s | %-34s | %-9d | %s\n", r.phase, r.compose.against(quiet.compose), r.plans.against(quiet.plans), r.logLines, r.attacker)
	}
	fmt.Println()
	for _, r := range rows {
		fmt.Printf("stats after %s: %s\n", r.phase, r.stats)
	}
}

// latencies are one phase's answers: their times, and how many were lost.
type latencies struct {
	took []time.Duration
	lost int
}

func (l latencies) quantile(q float64) time.Duration {
	if len(l.took) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(l.took))
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func (l latencies) against(quiet latencies) string {
	if len(l.took)+l.lost == 0 {
		return "-"
	}
	ratio := func(q float64) string {
		if base := quiet.quantile(q); base > 0 {
			return fmt.Sprintf(" (%.1fx)", float64(l.quantile(q))/float64(base))
		}
		return ""
	}
	return fmt.Sprintf("%d/%d, %s, %s%s", l.lost, len(l.took)+l.lost,
		l.quantile(0.5).Round(10*time.Microsecond), l.quantile(0.99).Round(10*time.Microsecond), ratio(0.99))
}

// node is a node's connection and its clients.
type node struct {
	name   string
	nc     *nats.Conn
	client *client.Client
	writer *nodeclient.Client
}

func connectNode(base, name string) (*node, error) {
	nc, err := nats.Connect(userURL(base, name), nats.CustomInboxPrefix(nodeclient.InboxPrefix(name)))
	if err != nil {
		return nil, err
	}
	writer, err := nodeclient.New(context.Background(), nodeclient.Config{Conn: nc, Node: name})
	if err != nil {
		nc.Close()
		return nil, err
	}
	return &node{name: name, nc: nc, client: client.New(nc, client.AsNode(name)), writer: writer}, nil
}

func waitServing(ctx context.Context, n *node) error {
	deadline := time.Now().Add(30 * time.Second)
	for {
		ask, cancel := context.WithTimeout(ctx, time.Second)
		_, err := n.client.Compose(ask, &provisionerv1.ComposeRequest{Node: n.name})
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the service answered nothing in 30s: %w", err)
		}
		time.Sleep(100 * time.Millisecond) // polling the service's start
	}
}

// writeNeeds writes the node's modules x needs, each value marked with
// round so that a new round changes every one.
func (n *node) writeNeeds(ctx context.Context, modules, needs, round int) error {
	for m := range modules {
		for i := range needs {
			need := &provisionerv1.Need{Placeholder: fmt.Sprintf("${port:p%d}", i), Provider: "ports", Builds: []string{fmt.Sprint("b", round)}}
			if _, err := n.writer.PutNeed(ctx, fmt.Sprintf("m%d", m), "port", fmt.Sprintf("p%d", i), need); err != nil {
				return fmt.Errorf("%s's need: %w", n.name, err)
			}
		}
	}
	return nil
}

// askCompose asks the node's compose cfg.asks times at cfg.rate, each in
// its own goroutine so that a slow answer delays no later ask.
func (n *node) askCompose(ctx context.Context, cfg config) latencies {
	var (
		mu  sync.Mutex
		out latencies
		wg  sync.WaitGroup
	)
	tick := time.NewTicker(time.Duration(float64(time.Second) / cfg.rate))
	defer tick.Stop()
	for range cfg.asks {
		<-tick.C
		wg.Go(func() {
			ask, cancel := context.WithTimeout(ctx, cfg.timeout)
			defer cancel()
			start := time.Now()
			_, err := n.client.Compose(ask, &provisionerv1.ComposeRequest{Node: n.name})
			took := time.Since(start)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				out.lost++
				return
			}
			out.took = append(out.took, took)
		})
	}
	wg.Wait()
	return out
}

// pushed numbers the needs pushes writes, each a new one.
var pushed atomic.Int64

// pushes writes a new need of the node's cfg.asks times, at most cfg.rate a
// second, each time waiting for its plan watch to hear the new digest: the
// time from the write's answer to the new composition.
func (n *node) pushes(ctx context.Context, cfg config, heard <-chan *provisionerv1.ComposeResponse) latencies {
	var out latencies
	for range cfg.asks {
		paced := time.After(time.Duration(float64(time.Second) / cfg.rate))
		name := fmt.Sprintf("x%d", pushed.Add(1))
		need := &provisionerv1.Need{Placeholder: "${port:" + name + "}", Provider: "ports"}
		put, cancel := context.WithTimeout(ctx, cfg.timeout)
		_, err := n.writer.PutNeed(put, "pushed", "port", name, need)
		cancel()
		if err != nil {
			out.lost++
			<-paced
			continue
		}
		written := time.Now()
		select {
		case <-heard:
			out.took = append(out.took, time.Since(written))
		case <-time.After(cfg.timeout):
			out.lost++
		}
		<-paced
	}
	return out
}

// composeStats is the compose endpoints' micro stats, as alice reads them.
// composeStats are the compose-node endpoint's stats, as every micro
// instance of the service (each partition's is one) answers them within
// half a second: micro's counts summed, and one instance's data (the
// endpoint's whole).
func composeStats(alice *nats.Conn) string {
	inbox := alice.NewRespInbox()
	sub, err := alice.SubscribeSync(inbox)
	if err != nil {
		return err.Error()
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := alice.PublishRequest("$SRV.STATS."+wire.ServiceName, inbox, nil); err != nil {
		return err.Error()
	}
	var requests, errs int
	var data []byte
	for {
		msg, err := sub.NextMsg(500 * time.Millisecond)
		if err != nil {
			break
		}
		var stats micro.Stats
		if err := json.Unmarshal(msg.Data, &stats); err != nil {
			return err.Error()
		}
		for _, e := range stats.Endpoints {
			if e.Name == wire.ComposeNodeEndpoint {
				requests, errs, data = requests+e.NumRequests, errs+e.NumErrors, e.Data
			}
		}
	}
	return fmt.Sprintf("%s requests %d errors %d data %s", wire.ComposeNodeEndpoint, requests, errs, data)
}

func startService(bin string, flags []string, base, logFile string) (stop func(), err error) {
	out, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, append([]string{"serve",
		"--nats-url", userURL(base, wire.ServerIdentity),
		"--writer-nats-url", userURL(base, wire.WriterIdentity),
		"--state-dir", filepath.Join(filepath.Dir(logFile), "state")}, flags...)...)
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		_ = out.Close()
		return nil, fmt.Errorf("start %s (make build): %w", bin, err)
	}
	return func() {
		_ = cmd.Process.Signal(os.Interrupt)
		_ = cmd.Wait()
		_ = out.Close()
	}, nil
}

// startAttack runs this program again as ace, attacking for span, and
// returns how to stop it early and read what it did.
func startAttack(kind, aceURL string, span time.Duration, cfg config) (stop func() (string, error), err error) {
	cmd := exec.Command(os.Args[0], "-attack", kind, "-attack-url", aceURL, "-attack-for", span.String(),
		"-churners", fmt.Sprint(cfg.churners), "-publishers", fmt.Sprint(cfg.publishers),
		"-modules", fmt.Sprint(cfg.modules), "-needs", fmt.Sprint(cfg.needs))
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	return func() (string, error) {
		_ = cmd.Process.Signal(os.Interrupt)
		if err := cmd.Wait(); err != nil {
			return "", fmt.Errorf("ace's %s: %w", kind, err)
		}
		return strings.TrimSpace(out.String()), nil
	}, nil
}

// attack is ace: it floods or churns until -attack-for passes or it is
// interrupted, then prints what it did.
func attack(cfg config) error {
	ctx, cancel := signalContext(cfg.attackFor)
	defer cancel()
	n, err := connectNode(cfg.attackAt, "ace")
	if err != nil {
		return err
	}
	defer n.nc.Close()
	var done atomic.Int64
	start := time.Now()
	var wg sync.WaitGroup
	switch cfg.attack {
	case "flood":
		body, _ := proto.Marshal(&provisionerv1.ComposeRequest{Node: "ace"})
		subject := wire.NodeSubject(wire.ComposeSubject, "ace")
		reply := nodeclient.InboxPrefix("ace") + ".never-read"
		for range cfg.publishers {
			wg.Go(func() {
				for ctx.Err() == nil {
					for range 1024 {
						if n.nc.PublishRequest(subject, reply, body) == nil {
							done.Add(1)
						}
					}
				}
			})
		}
	case "churn":
		for w := range cfg.churners {
			wg.Go(func() {
				for round := 1; ctx.Err() == nil; round++ {
					m, i := (w+round)%cfg.modules, round%cfg.needs
					need := &provisionerv1.Need{Placeholder: fmt.Sprintf("${port:p%d}", i), Provider: "ports", Builds: []string{fmt.Sprint("b", round, w)}}
					if _, err := n.writer.PutNeed(ctx, fmt.Sprintf("m%d", m), "port", fmt.Sprintf("p%d", i), need); err == nil {
						done.Add(1)
					}
				}
			})
		}
	default:
		return fmt.Errorf("no attack %q (flood, churn)", cfg.attack)
	}
	wg.Wait()
	took := time.Since(start)
	verb := map[string]string{"flood": "requests sent", "churn": "puts answered"}[cfg.attack]
	fmt.Printf("%d %s, %.0f/s", done.Load(), verb, float64(done.Load())/took.Seconds())
	return nil
}

// signalContext is done after d, or once the program is interrupted.
func signalContext(d time.Duration) (context.Context, context.CancelFunc) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	ctx, cancel := context.WithTimeout(ctx, d)
	return ctx, func() { cancel(); stop() }
}

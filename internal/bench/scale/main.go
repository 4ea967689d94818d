// Command scale (internal/bench/scale, formerly benchscale) measures how one instance grows with the mesh, as an
// operator sees it: for each mesh size it writes a synthetic mesh into a
// nats-server of its own process, execs bin/mesh-provisioner serve against
// it, and reports
//
//   - RSS a key: the serving process's resident memory (VmRSS) once its
//     copy has settled, above the same binary's serving empty buckets;
//     and then the Go heap in use, and its goal (twice what the last
//     collection found live), read from serve's /metrics: what of the
//     resident memory is data, and what the runtime keeps;
//   - start: from exec to the first compose answer at the buckets' last
//     revisions that equals the one composed from the mesh itself (a lone
//     instance answers a node from its keys read alone while its copy
//     loads); whole: from exec to the first answer of every node's needs
//     at the last revision, which waits for the whole copy; and the same
//     messages pulled bare from JetStream (the watchers' consumers without
//     the service), in the same run;
//   - compose p50/p99 of nodes taken at random, one requester;
//   - verb throughput at 8 requesters: compose (JSON) and needs by node;
//   - a mesh-wide change: the registry entry most nodes read, changed,
//     until the last of its readers' new digests is heard from the plans
//     bucket; then restored by the seat's holder 4 s later
//     (--registry-restore-delay), likewise. A change whose digests take
//     longer is cut short by the restore, and says how many were heard.
//
// It prints a table and writes a plot of the figures per key against the
// mesh's size (-plot, an SVG or PNG by its name).
//
//	go build -o bin/mesh-provisioner ./cmd/mesh-provisioner
//	go run ./internal/bench/scale -nodes 1000,4000,10000
//
// Machines are small and noisy: read the ratios and the trend, not the
// absolute figures.
package main

import (
	"bufio"
	"context"
	crand "crypto/rand"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/bench/benchnats"
	"github.com/novox/mesh-provisioner/internal/bench/meshchange"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

type config struct {
	sizes          []int
	modules, needs int
	bin, plot      string
	samples        int
	round          time.Duration
	settle         time.Duration
	bucketMaxBytes int64
	keepServerLogs bool
	// logs, when set, is a directory each served binary writes its log to,
	// at debug level, a file each (logFile).
	logs string
	// instances, above 1, serve the same mesh again after the one
	// instance, each --hold of its share of partitions (partitioned.go).
	instances, partitions int
	auto                  bool // with instances: --hold auto
	expect                bool // with auto: --hold-expect of instances
	storedAsWritten       bool // with instances: the state buckets store keys as written, not by partition
}

func main() {
	var cfg config
	sizes := flag.String("nodes", "1000,4000,10000", "comma-separated mesh sizes, in nodes")
	flag.IntVar(&cfg.modules, "modules", 30, "modules per node")
	flag.IntVar(&cfg.needs, "needs", 10, "needs per module")
	flag.StringVar(&cfg.bin, "bin", "bin/mesh-provisioner", "the binary measured")
	flag.StringVar(&cfg.plot, "plot", "build/bench-scale.svg", "the plot written (.svg or .png); empty writes none")
	flag.IntVar(&cfg.samples, "samples", 500, "compose requests timed one at a time, for p50/p99")
	flag.DurationVar(&cfg.round, "round", 2*time.Second, "how long each throughput round lasts")
	flag.DurationVar(&cfg.settle, "settle", 2*time.Second, "how long the resident memory must stay within 1% to be read")
	flag.BoolVar(&cfg.keepServerLogs, "v", false, "show the served binary's logs")
	flag.StringVar(&cfg.logs, "logs", "", "a directory each served binary writes its log to, at debug level, a file each named by its state directory (to read the first answer's timeline, say), in place of -v's")
	flag.IntVar(&cfg.instances, "instances", 1, "above 1: after the one instance, this many serve the same mesh, each --hold of an equal share of -partitions, and their figures are set against the one's")
	flag.IntVar(&cfg.partitions, "partitions", 16, "with -instances: the partitions of the mesh (a multiple of -instances)")
	flag.BoolVar(&cfg.storedAsWritten, "stored-as-written", false, "with -instances: the state buckets store every node's keys together, as buckets made before the mesh had partitions do, rather than by partition as serve --partitions makes them; each instance then reads every key as it loads")
	flag.BoolVar(&cfg.auto, "auto", false, "with -instances: each is given --hold auto and deals itself its share, rather than a list")
	flag.BoolVar(&cfg.expect, "expect", true, "with -auto: each is also given --hold-expect of -instances, as a deploy that knows its replicas is; false: each gathers the members over 1.5s of discovery")
	natsOnly := flag.String(benchnats.Flag, "", "internal: run only a nats-server with its store in this directory, print its URL, and serve until stdin closes")
	flag.Parse()
	if *natsOnly != "" {
		if err := benchnats.Serve(*natsOnly); err != nil {
			fmt.Fprintln(os.Stderr, "benchscale:", err)
			os.Exit(1)
		}
		return
	}
	for _, s := range strings.Split(*sizes, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || n <= 0 {
			fmt.Fprintf(os.Stderr, "benchscale: -nodes %q: want positive numbers\n", *sizes)
			os.Exit(2)
		}
		cfg.sizes = append(cfg.sizes, n)
	}
	if cfg.instances > 1 && (cfg.partitions < cfg.instances || cfg.partitions%cfg.instances != 0 || cfg.partitions > wire.MaxPartitions) {
		fmt.Fprintf(os.Stderr, "benchscale: -partitions %d: want a multiple of -instances %d, at most %d\n", cfg.partitions, cfg.instances, wire.MaxPartitions)
		os.Exit(2)
	}
	// A state bucket of the 10k mesh holds well under 1 GiB; the limit is
	// reserved in the server's store (64 GiB) for each of them, the plans
	// bucket too.
	cfg.bucketMaxBytes = 8 << 30
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchscale:", err)
		os.Exit(1)
	}
}

// figures are one mesh size's.
type figures struct {
	nodes, keys           int
	baselineRSS, rss, hwm int64 // bytes
	// baselineHeap and heap are the Go heap's, empty and loaded.
	baselineHeap, heap    heapFigures
	start, whole, pull    time.Duration
	p50, p99              time.Duration
	composeRate, needRate float64
	// changed and restored are meshChange's: the last reader's new digest
	// heard after a registry entry changed, then restored.
	changed, restored wave
	// split are the same mesh's figures served by cfg.instances, if more
	// than one.
	split *splitFigures
}

func (f figures) rssPerKey() float64 { return float64(f.rss-f.baselineRSS) / float64(f.keys) }

func (f figures) startPerKey() float64 { return float64(f.start.Nanoseconds()) / float64(f.keys) }

func (f figures) wholePerKey() float64 { return float64(f.whole.Nanoseconds()) / float64(f.keys) }

func run(cfg config) error {
	if _, err := os.Stat(cfg.bin); err != nil {
		return fmt.Errorf("%s: build it first (make build): %w", cfg.bin, err)
	}
	var all []figures
	for _, nodes := range cfg.sizes {
		f, err := measure(cfg, nodes)
		if err != nil {
			return fmt.Errorf("%d nodes: %w", nodes, err)
		}
		all = append(all, f)
		printTable(all) // after each size: a long run shows what it has
	}
	if cfg.plot != "" {
		if err := os.MkdirAll(filepath.Dir(cfg.plot), 0o755); err != nil {
			return err
		}
		if err := writePlot(cfg.plot, all); err != nil {
			return err
		}
		fmt.Println("plot:", cfg.plot)
	}
	first, last := all[0], all[len(all)-1]
	if len(all) > 1 {
		fmt.Printf("from %d to %d nodes: RSS a key x%.2f, copy whole a key x%.2f (flat is within 15%%: x0.85 to x1.15); first answer x%.2f (one node's read: flat in all)\n",
			first.nodes, last.nodes, last.rssPerKey()/first.rssPerKey(), last.wholePerKey()/first.wholePerKey(), float64(last.start)/float64(first.start))
	}
	return nil
}

func printTable(all []figures) {
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "nodes\tkeys\tempty RSS MiB\tRSS MiB\tpeak MiB\tRSS B/key\theap in use (goal) MiB\tstart\twhole\tbare pull\tstart/pull\twhole/pull\twhole µs/key\tcompose p50\tcompose p99\tcompose req/s\tneeds req/s\tchange's last digest\trestored's\t")
	for _, f := range all {
		fmt.Fprintf(w, "%d\t%d\t%.1f\t%.1f\t%.1f\t%.0f\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t\n",
			f.nodes, f.keys, mib(f.baselineRSS), mib(f.rss), mib(f.hwm), f.rssPerKey(), f.heap,
			f.start.Round(time.Millisecond), f.whole.Round(time.Millisecond), f.pull.Round(time.Millisecond),
			float64(f.start)/float64(f.pull), float64(f.whole)/float64(f.pull), f.wholePerKey()/1e3,
			f.p50.Round(time.Microsecond), f.p99.Round(time.Microsecond), f.composeRate, f.needRate,
			f.changed, f.restored)
	}
	_ = w.Flush()
	printSplit(all)
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// measure runs one mesh size on a nats-server of its own.
func measure(cfg config, nodes int) (figures, error) {
	f := figures{nodes: nodes}
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "benchscale")
	if err != nil {
		return f, err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// The mappings of a partitioned mesh: the operators' subjects the one
	// instance answers are not mapped.
	natsDir := filepath.Join(dir, "nats")
	if err := os.MkdirAll(natsDir, 0o755); err != nil {
		return f, err
	}
	url, stopNATS, err := benchnats.StartWith(natsDir, permissions.MappingsConfig(cfg.partitions))
	if err != nil {
		return f, err
	}
	defer stopNATS()
	nc, err := nats.Connect(url)
	if err != nil {
		return f, err
	}
	defer nc.Close()
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(publishWindow))
	if err != nil {
		return f, err
	}
	made := buckets.Config{MaxBytes: cfg.bucketMaxBytes}
	if cfg.instances > 1 && !cfg.storedAsWritten {
		made.Partitions = cfg.partitions // as the instances' serve --partitions makes them
	}
	if err := buckets.Ensure(ctx, js, made); err != nil {
		return f, err
	}

	// The baseline: the same binary serving the empty buckets.
	srv, err := startServe(cfg, url, filepath.Join(dir, "empty"))
	if err != nil {
		return f, err
	}
	if err := waitServing(nc); err != nil {
		srv.stop()
		return f, err
	}
	f.baselineRSS, err = settledRSS(srv.pid(), cfg.settle)
	if err == nil {
		f.baselineHeap, err = srv.heap()
	}
	srv.stop()
	if err != nil {
		return f, err
	}

	began := time.Now()
	mesh := synth.Generate(synth.Config{Nodes: nodes, Modules: cfg.modules, Needs: cfg.needs})
	capture, err := mesh.Capture(registry.Table())
	if err != nil {
		return f, err
	}
	for _, b := range capture.GetBuckets() {
		for _, e := range b.GetEntries() {
			if _, err := js.PublishAsync(wire.KVSubject(b.GetBucket(), e.GetKey()), e.GetValue()); err != nil {
				return f, err
			}
			f.keys++
			if f.keys%(publishWindow/2) == 0 { // never stall on the client's window
				if err := published(js); err != nil {
					return f, err
				}
			}
		}
	}
	if err := published(js); err != nil {
		return f, err
	}
	names := make([]string, len(mesh.Nodes))
	for i, n := range mesh.Nodes {
		names[i] = n.Name
	}
	c := change{readers: map[string]bool{}}
	var reads []bool
	c.kind, reads = meshchange.WidestKind(mesh)
	for i, r := range reads {
		if r {
			c.readers[names[i]] = true
		}
	}
	mesh = nil
	fmt.Printf("%d nodes: %d keys written in %s\n", nodes, f.keys, time.Since(began).Round(time.Millisecond))

	// What a correct answer is: the node composed from the mesh itself.
	replay, err := answers.NewReplay(capture)
	if err != nil {
		return f, err
	}
	node := names[len(names)/2]
	want, err := replay.Compose(&provisionerv1.ComposeRequest{Node: node})
	if err != nil {
		return f, err
	}
	replay, capture = nil, nil
	last, err := lastRevisions(ctx, js)
	if err != nil {
		return f, err
	}

	if f.pull, err = barePull(ctx, js); err != nil {
		return f, err
	}

	srv, err = startServe(cfg, url, filepath.Join(dir, "loaded"))
	if err != nil {
		return f, err
	}
	defer srv.stop()
	if err := firstCorrectAnswer(nc, node, last, want, srv.started, cfg.keepServerLogs); err != nil {
		return f, err
	}
	f.start = time.Since(srv.started)
	if err := firstWholeAnswer(nc, last); err != nil {
		return f, err
	}
	f.whole = time.Since(srv.started)
	if f.rss, err = settledRSS(srv.pid(), cfg.settle); err != nil {
		return f, err
	}
	f.hwm, _ = procStatus(srv.pid(), "VmHWM")
	if f.heap, err = srv.heap(); err != nil {
		return f, err
	}

	if f.p50, f.p99, err = composeLatency(nc, names, cfg.samples); err != nil {
		return f, err
	}
	compose := func(node string) (string, string, proto.Message) {
		return wire.ComposeSubject, wire.ContentTypeJSON, &provisionerv1.ComposeRequest{Node: node}
	}
	needs := func(node string) (string, string, proto.Message) {
		return wire.ProvisioningSubject, wire.ContentTypeProtobuf, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: node}
	}
	if f.composeRate, err = throughput(url, names, 8, cfg.round, compose); err != nil {
		return f, err
	}
	if f.needRate, err = throughput(url, names, 8, cfg.round, needs); err != nil {
		return f, err
	}
	if f.changed, f.restored, err = meshChange(ctx, js, nc, c, len(names), 1); err != nil {
		return f, err
	}
	if cfg.instances > 1 {
		srv.stop()
		printTable([]figures{f}) // the one instance's, before the long part
		if f.split, err = measureSplit(cfg, url, dir, nc, js, names, node, last, want, c); err != nil {
			return f, fmt.Errorf("%d instances: %w", cfg.instances, err)
		}
	}
	return f, nil
}

// publishWindow is how many asynchronous publishes may await their ack.
const publishWindow = 16384

// published waits for every asynchronous publish's ack.
func published(js jetstream.JetStream) error {
	select {
	case <-js.PublishAsyncComplete():
		return nil
	case <-time.After(5 * time.Minute):
		return errors.New("the mesh's messages were not all stored within 5 minutes")
	}
}

// served is the binary serving, as a child process.
type served struct {
	cmd     *exec.Cmd
	started time.Time
	// metrics is its /metrics, asked with token.
	metrics, token string
}

func (s *served) pid() int { return s.cmd.Process.Pid }

func (s *served) stop() {
	_ = s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { _ = s.cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		<-done
	}
}

func startServe(cfg config, url, stateDir string, args ...string) (*served, error) {
	addr, token, tokenFile, err := operatorsHTTP(stateDir)
	if err != nil {
		return nil, err
	}
	level := "warn"
	if cfg.logs != "" {
		level = "debug"
	}
	cmd := exec.Command(cfg.bin, append([]string{"serve", "--nats-url", url, "--state-dir", stateDir,
		"--http", addr, "--http-token-file", tokenFile,
		"--bucket-max-bytes", strconv.FormatInt(cfg.bucketMaxBytes, 10),
		"--node-max-keys", "-1", "--node-max-bytes", "-1", "--log-level", level,
		"--registry-restore-delay", restoreDelay.String(),
		// Several instances loading a large mesh at once on a small machine
		// take longer than the default minute.
		"--ready-timeout", "15m"}, args...)...)
	var logFile *os.File
	if cfg.logs != "" {
		if logFile, err = openLog(cfg.logs, stateDir); err != nil {
			return nil, err
		}
		cmd.Stdout, cmd.Stderr = logFile, logFile
	} else if cfg.keepServerLogs {
		cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	}
	s := &served{cmd: cmd, started: time.Now(), metrics: "http://" + addr + "/metrics", token: token}
	err = cmd.Start()
	if logFile != nil {
		_ = logFile.Close() // the child holds its own descriptor
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// openLog creates the log file of the binary served on stateDir in dir,
// named by stateDir's path under the temporary directory (measure's
// directory of one mesh size, then empty, loaded, split-0, split-one):
// one file a served binary of the run.
func openLog(dir, stateDir string) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("-logs: %w", err)
	}
	place, err := filepath.Rel(os.TempDir(), stateDir)
	if err != nil {
		return nil, fmt.Errorf("-logs: %w", err)
	}
	return os.Create(filepath.Join(dir, strings.ReplaceAll(place, string(filepath.Separator), "-")+".log"))
}

// waitServing waits until the service answers a ping.
func waitServing(nc *nats.Conn) error {
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if _, err := nc.Request("$SRV.PING."+wire.ServiceName, nil, time.Second); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return errors.New("the service did not answer a ping within a minute")
}

// firstCorrectAnswer asks for node's composition at the last revisions
// until the answer equals want. With verbose, it prints each refusal that
// differs from the one before, and when it came after started, then the
// correct answer's phases: what kept the first answer.
func firstCorrectAnswer(nc *nats.Conn, node string, last *provisionerv1.Revisions, want *provisionerv1.ComposeResponse, started time.Time, verbose bool) error {
	want = proto.CloneOf(want)
	want.Phases, want.Revisions = nil, nil
	deadline := time.Now().Add(5 * time.Minute)
	var lastErr error
	for time.Now().Before(deadline) {
		got := &provisionerv1.ComposeResponse{}
		err := request(nc, wire.ComposeSubject, wire.ContentTypeProtobuf, &provisionerv1.ComposeRequest{Node: node, MinRevisions: last}, got)
		if err == nil {
			phases := got.GetPhases()
			got.Phases, got.Revisions = nil, nil
			if proto.Equal(got, want) {
				if verbose {
					fmt.Printf("first correct answer of %s, %s after the start: %s\n", node, time.Since(started).Round(time.Millisecond), phasesLine(phases))
				}
				return nil
			}
			err = errors.New("an answer that differs from the mesh's composition")
			if verbose {
				diff := cmp.Diff(want, got, protocmp.Transform())
				err = fmt.Errorf("%w (-want +got, the start):\n%s", err, diff[:min(len(diff), 600)])
			}
		}
		if verbose && (lastErr == nil || err.Error() != lastErr.Error()) {
			fmt.Printf("first answer of %s, %s after the start: %v\n", node, time.Since(started).Round(time.Millisecond), err)
		}
		lastErr = err
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("no correct answer within 5 minutes: %w", lastErr)
}

// phasesLine says an answer's phases (the service's timings of it) on one
// line: "wait 1ms, read 600ms, ...".
func phasesLine(phases []*provisionerv1.Phase) string {
	var parts []string
	for _, p := range phases {
		parts = append(parts, fmt.Sprintf("%s %s", p.GetName(), p.GetDuration().AsDuration().Round(time.Microsecond)))
	}
	return strings.Join(parts, ", ")
}

// firstWholeAnswer asks for the first need of every node's at the last
// revision until it comes: what spans every node is answered from the
// whole copy only.
func firstWholeAnswer(nc *nats.Conn, last *provisionerv1.Revisions) error {
	deadline := time.Now().Add(5 * time.Minute)
	var err error
	for time.Now().Before(deadline) {
		req := &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, MinRevision: last.GetNeeds(), PageSize: 1}
		if err = request(nc, wire.ProvisioningSubject, wire.ContentTypeProtobuf, req, nil); err == nil {
			return nil
		}
		time.Sleep(2 * time.Millisecond)
	}
	return fmt.Errorf("no provisioning answer within 5 minutes: %w", err)
}

func lastRevisions(ctx context.Context, js jetstream.JetStream) (*provisionerv1.Revisions, error) {
	last := map[string]uint64{}
	for _, b := range keys.Buckets() {
		s, err := js.Stream(ctx, wire.StreamOf(b))
		if err != nil {
			return nil, err
		}
		last[b] = s.CachedInfo().State.LastSeq
	}
	return &provisionerv1.Revisions{Registry: last[keys.RegistryBucket], Needs: last[keys.NeedsBucket],
		Applied: last[keys.AppliedBucket], Collect: last[keys.CollectBucket]}, nil
}

// barePull reads every key's last value of the four buckets as the
// watchers' consumers do (unacknowledged, memory, last per subject, the
// same batch), one consumer a bucket at once, and does nothing with them.
func barePull(ctx context.Context, js jetstream.JetStream) (time.Duration, error) {
	start := time.Now()
	var wg sync.WaitGroup
	errs := make([]error, len(keys.Buckets()))
	for i, b := range keys.Buckets() {
		wg.Go(func() { errs[i] = pullAll(ctx, js, b) })
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

func pullAll(ctx context.Context, js jetstream.JetStream, bucket string) error {
	stream, err := js.Stream(ctx, wire.StreamOf(bucket))
	if err != nil {
		return err
	}
	consumer, err := stream.CreateConsumer(ctx, jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     wire.KVPrefix(bucket) + ">",
		DeliverPolicy:     jetstream.DeliverLastPerSubjectPolicy,
		InactiveThreshold: 10 * time.Second,
		MemoryStorage:     true,
		Replicas:          1,
	})
	if err != nil {
		return err
	}
	if consumer.CachedInfo().NumPending == 0 {
		return nil
	}
	messages, err := consumer.Messages(jetstream.PullMaxMessages(4096))
	if err != nil {
		return err
	}
	defer messages.Stop()
	for {
		msg, err := messages.Next()
		if err != nil {
			return err
		}
		meta, err := msg.Metadata()
		if err != nil {
			return err
		}
		if meta.NumPending == 0 {
			return nil
		}
	}
}

// composeLatency composes random nodes one at a time.
func composeLatency(nc *nats.Conn, nodes []string, samples int) (p50, p99 time.Duration, err error) {
	rng := rand.New(rand.NewPCG(1, 2))
	took := make([]time.Duration, 0, samples)
	for range samples {
		node := nodes[rng.IntN(len(nodes))]
		began := time.Now()
		if err := request(nc, wire.ComposeSubject, wire.ContentTypeProtobuf, &provisionerv1.ComposeRequest{Node: node}, nil); err != nil {
			return 0, 0, err
		}
		took = append(took, time.Since(began))
	}
	slices.Sort(took)
	return took[len(took)/2], took[len(took)*99/100], nil
}

// throughput runs requesters, each on its own connection, asking in a
// closed loop for d, and returns the answers a second.
func throughput(url string, nodes []string, requesters int, d time.Duration, ask func(node string) (string, string, proto.Message)) (float64, error) {
	var wg sync.WaitGroup
	var answered atomic.Int64
	var failed atomic.Value
	stop := time.Now().Add(d)
	start := time.Now()
	for i := range requesters {
		wg.Go(func() {
			nc, err := nats.Connect(url)
			if err != nil {
				failed.Store(err)
				return
			}
			defer nc.Close()
			for j := i; time.Now().Before(stop); j++ {
				subject, contentType, req := ask(nodes[(j*7919)%len(nodes)])
				if err := request(nc, subject, contentType, req, nil); err != nil {
					failed.Store(err)
					return
				}
				answered.Add(1)
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return 0, err
	}
	return float64(answered.Load()) / time.Since(start).Seconds(), nil
}

// request asks and, if out is given, decodes the binary answer into it.
func request(nc *nats.Conn, subject, contentType string, req, out proto.Message) error {
	msg := nats.NewMsg(subject)
	msg.Header.Set("Content-Type", contentType)
	var err error
	if contentType == wire.ContentTypeJSON {
		msg.Data, err = protojson.Marshal(req)
	} else {
		msg.Data, err = proto.Marshal(req)
	}
	if err != nil {
		return err
	}
	reply, err := nc.RequestMsg(msg, 30*time.Second)
	if err != nil {
		return err
	}
	if err := wire.ErrorOf(reply); err != nil {
		return err
	}
	if out != nil {
		return proto.Unmarshal(reply.Data, out)
	}
	return nil
}

// settledRSS reads the process's VmRSS until it stays within 1% for d.
func settledRSS(pid int, d time.Duration) (int64, error) {
	deadline := time.Now().Add(2 * time.Minute)
	var since time.Time
	var ref int64
	for time.Now().Before(deadline) {
		rss, err := procStatus(pid, "VmRSS")
		if err != nil {
			return 0, err
		}
		if ref == 0 || abs(rss-ref) > ref/100 {
			ref, since = rss, time.Now()
		} else if time.Since(since) >= d {
			return rss, nil
		}
		time.Sleep(100 * time.Millisecond)
	}
	return 0, errors.New("the resident memory did not settle within 2 minutes")
}

func abs(n int64) int64 { return max(n, -n) }

// procStatus reads a field of /proc/<pid>/status, in bytes.
func procStatus(pid int, field string) (int64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	defer func() { _ = f.Close() }()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("/proc/%d/status has no %s", pid, field)
}

// operatorsHTTP returns an address on the loopback for serve's --http, and
// a token written to a file in stateDir for its --http-token-file. The
// port is one the system gave and took back: another process may take it
// meanwhile, and serve then exits, its reason in its log (-v), and the
// bench's wait for its answers fails.
func operatorsHTTP(stateDir string) (addr, token, tokenFile string, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", "", "", err
	}
	addr = l.Addr().String()
	if err := l.Close(); err != nil {
		return "", "", "", err
	}
	if err := os.MkdirAll(stateDir, 0o700); err != nil {
		return "", "", "", err
	}
	token = crand.Text()
	tokenFile = filepath.Join(stateDir, "http-token")
	return addr, token, tokenFile, os.WriteFile(tokenFile, []byte(token+"\n"), 0o600)
}

// heapFigures are a process's Go heap, bytes: in use, and its goal, twice
// what the last collection found live (GOGC 100).
type heapFigures struct{ inUse, goal int64 }

func (h heapFigures) String() string { return fmt.Sprintf("%.0f (%.0f)", mib(h.inUse), mib(h.goal)) }

// metricsClient reads serve's /metrics: a process that stopped answering
// fails the bench rather than hanging it.
var metricsClient = &http.Client{Timeout: 10 * time.Second}

// heap reads the process's Go heap from its /metrics.
func (s *served) heap() (heapFigures, error) {
	req, err := http.NewRequest(http.MethodGet, s.metrics, nil)
	if err != nil {
		return heapFigures{}, err
	}
	req.Header.Set("Authorization", "Bearer "+s.token)
	resp, err := metricsClient.Do(req)
	if err != nil {
		return heapFigures{}, err
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return heapFigures{}, fmt.Errorf("%s: %s", s.metrics, resp.Status)
	}
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return heapFigures{}, fmt.Errorf("%s: %w", s.metrics, err)
	}
	gauge := func(name string) (int64, error) {
		f := families[name]
		if f == nil || len(f.GetMetric()) == 0 {
			return 0, fmt.Errorf("%s: no %s", s.metrics, name)
		}
		return int64(f.GetMetric()[0].GetGauge().GetValue()), nil
	}
	var h heapFigures
	if h.inUse, err = gauge("go_memstats_heap_inuse_bytes"); err != nil {
		return h, err
	}
	h.goal, err = gauge("go_memstats_next_gc_bytes")
	return h, err
}

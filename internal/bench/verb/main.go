// Command verb (internal/bench/verb, formerly benchverb) measures the verbs against the bus itself: it fills a
// mesh into an embedded JetStream, starts the service, and for each kind of
// request serves an echo endpoint that returns the very same answer bytes
// (what NATS alone costs). It alternates rounds of the real verb and of the
// echo at 1 and at 8 requesters, and prints each kind's throughput and p99
// as a ratio of the echo's, in the same run. It also prints the copy's bytes
// per key above the process's baseline, and how long a cold start takes to
// a correct answer.
//
//	go run ./internal/bench/verb -nodes 1000 -modules 30 -needs 10
//
// Machines are small and noisy: read the ratios, not the absolute figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/bench/benchnats"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

type config struct {
	nodes, modules, needs int
	hot                   int
	round                 time.Duration
	rounds                int
	requesters            []int
	only                  string
	profile               *os.File
}

func main() {
	var cfg config
	flag.IntVar(&cfg.nodes, "nodes", 1000, "nodes of the synthetic mesh")
	flag.IntVar(&cfg.modules, "modules", 30, "modules per node")
	flag.IntVar(&cfg.needs, "needs", 10, "needs per module")
	flag.IntVar(&cfg.hot, "hot", 16, "nodes the requests go to, in turn")
	flag.DurationVar(&cfg.round, "round", time.Second, "length of one round")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds of each side (real and echo) at each requester count")
	cpuprofile := flag.String("cpuprofile", "", "write a CPU profile of the cold start and the rounds to this file")
	only := flag.String("only", "", "measure only the request kinds whose name holds this")
	natsOnly := flag.String(benchnats.Flag, "", "internal: run only a nats-server with its store in this directory, print its URL, and serve until stdin closes")
	flag.Parse()
	if *natsOnly != "" {
		if err := benchnats.Serve(*natsOnly); err != nil {
			fmt.Fprintln(os.Stderr, "benchverb:", err)
			os.Exit(1)
		}
		return
	}
	cfg.only = *only
	if *cpuprofile != "" {
		f, err := os.Create(*cpuprofile)
		if err != nil {
			fmt.Fprintln(os.Stderr, "benchverb:", err)
			os.Exit(1)
		}
		defer func() { _ = f.Close() }()
		cfg.profile = f
	}
	cfg.requesters = []int{1, 8}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchverb:", err)
		os.Exit(1)
	}
}

func run(cfg config) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "benchverb")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	// The nats-server runs in a process of its own, as it would on a mesh:
	// the service's cold start and memory are its own.
	url, stop, err := benchnats.Start(dir)
	if err != nil {
		return err
	}
	defer stop()
	nc, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	if err := buckets.Ensure(ctx, js, benchBuckets); err != nil {
		return err
	}

	start := time.Now()
	mesh := synth.Generate(synth.Config{Nodes: cfg.nodes, Modules: cfg.modules, Needs: cfg.needs})
	capture, err := mesh.Capture(registry.Table())
	if err != nil {
		return err
	}
	total := 0
	for _, b := range capture.GetBuckets() {
		for _, e := range b.GetEntries() {
			if _, err := js.PublishAsync(wire.KVSubject(b.GetBucket(), e.GetKey()), e.GetValue()); err != nil {
				return err
			}
			total++
		}
	}
	<-js.PublishAsyncComplete()
	nodes := make([]string, 0, cfg.hot)
	for _, n := range mesh.Nodes[:min(cfg.hot, len(mesh.Nodes))] {
		nodes = append(nodes, n.Name)
	}
	capture, mesh = nil, nil // let the generated mesh go before the baseline is read
	fmt.Printf("mesh: %d keys written in %s (%d nodes x %d modules x %d needs, with applied and collection items)\n",
		total, time.Since(start).Round(time.Millisecond), cfg.nodes, cfg.modules, cfg.needs)

	// Memory: the heap with the nats-server and the mesh in its store, then
	// with the service's copy loaded too.
	baseline := heap()
	if cfg.profile != nil { // the load and the rounds (-only NONE: the load alone)
		if err := pprof.StartCPUProfile(cfg.profile); err != nil {
			return err
		}
		defer pprof.StopCPUProfile()
	}
	started := time.Now()
	inst, err := instance.Start(ctx, instance.Config{
		Service: service.Config{Conn: nc, WatchConn: nc, Logger: slog.New(slog.DiscardHandler), NodeMaxKeys: service.NoLimit, NodeMaxBytes: service.NoLimit},
		Buckets: benchBuckets,
	})
	if err != nil {
		return err
	}
	defer inst.Stop()
	svc := inst.Service()
	if err := svc.WaitReady(ctx); err != nil {
		return err
	}
	if _, err := request(nc, wire.ComposeSubject, wire.ContentTypeProtobuf, &provisionerv1.ComposeRequest{Node: nodes[0]}); err != nil {
		return err
	}
	cold := time.Since(started)
	loaded := heap()
	fmt.Printf("cold start: %s from Start to the copy whole and a correct compose answer, %d keys\n", cold.Round(time.Millisecond), total)
	fmt.Printf("copy: %.0f bytes a key above the baseline (%d MiB with the copy, %d MiB without)\n",
		float64(int64(loaded)-int64(baseline))/float64(total), loaded>>20, baseline>>20)

	kinds := []kind{
		{name: "needs by node, binary", subject: wire.ProvisioningSubject, contentType: wire.ContentTypeProtobuf,
			request: func(node string) proto.Message {
				return &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: node}
			}},
		{name: "needs by node, JSON", subject: wire.ProvisioningSubject, contentType: wire.ContentTypeJSON,
			request: func(node string) proto.Message {
				return &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: node}
			}},
		{name: "compose, unchanged node, JSON", subject: wire.ComposeSubject, contentType: wire.ContentTypeJSON,
			request: func(node string) proto.Message { return &provisionerv1.ComposeRequest{Node: node} }},
		{name: "compose right after a write, binary", subject: wire.ComposeSubject, contentType: wire.ContentTypeProtobuf, write: true,
			request: func(node string) proto.Message { return &provisionerv1.ComposeRequest{Node: node} }},
		{name: "compose right after a write, JSON", subject: wire.ComposeSubject, contentType: wire.ContentTypeJSON, write: true,
			request: func(node string) proto.Message { return &provisionerv1.ComposeRequest{Node: node} }},
		{name: "compose right after another node's binding, binary", subject: wire.ComposeSubject, contentType: wire.ContentTypeProtobuf, bind: true,
			request: func(node string) proto.Message { return &provisionerv1.ComposeRequest{Node: node} }},
	}
	needs, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		return err
	}
	bound, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: benchBound})
	if err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "request\trequesters\techo req/s\tverb req/s\tratio\techo p99\tverb p99\tp99 ratio\t")
	for _, k := range kinds {
		if !strings.Contains(k.name, cfg.only) {
			continue
		}
		echo, err := startEcho(nc, k, nodes)
		if err != nil {
			return err
		}
		for _, n := range cfg.requesters {
			var verb, bare []result
			for range cfg.rounds {
				r, err := k.round(url, writes{needs, bound}, wire.ServiceName, n, nodes, cfg.round)
				if err != nil {
					return fmt.Errorf("%s: %w", k.name, err)
				}
				verb = append(verb, r)
				r, err = k.round(url, writes{needs, bound}, "echo", n, nodes, cfg.round)
				if err != nil {
					return fmt.Errorf("%s echo: %w", k.name, err)
				}
				bare = append(bare, r)
			}
			v, e := merge(verb), merge(bare)
			fmt.Fprintf(w, "%s\t%d\t%.0f\t%.0f\t%.2f\t%s\t%s\t%.2f\t\n", k.name, n, e.rate(), v.rate(), v.rate()/e.rate(),
				e.p99().Round(time.Microsecond), v.p99().Round(time.Microsecond), float64(v.p99())/float64(e.p99()))
		}
		if err := echo.Stop(); err != nil {
			return err
		}
	}
	return w.Flush()
}

// heap returns the live heap after a full collection.
func heap() uint64 {
	runtime.GC()
	debug.FreeOSMemory()
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapAlloc
}

// kind is one kind of request measured.
type kind struct {
	name, subject, contentType string
	request                    func(node string) proto.Message
	// write puts one of the node's needs before each request, which then
	// asks for the copy to have reached it.
	write bool
	// bind puts a key of another node in a provider's bucket
	// (benchBound) before each request, which then asks for the copy to
	// have reached it.
	bind bool
}

// benchBound is the provider's bucket of the kinds that bind, its keys
// those of a node that is not asked.
var benchBound = wire.BoundBucket("bench")

// echoSubject is where the echo of a node's answer is asked.
func echoSubject(node string) string { return "bench.echo." + node }

// startEcho serves, for each node, the very answer bytes the verb gave.
func startEcho(nc *nats.Conn, k kind, nodes []string) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{Name: "bench-echo", Version: "0.0.0"})
	if err != nil {
		return nil, err
	}
	for _, node := range nodes {
		answer, err := request(nc, k.subject, k.contentType, k.request(node))
		if err != nil {
			return nil, err
		}
		headers := micro.Headers{"Content-Type": {k.contentType}}
		err = svc.AddEndpoint(node, micro.HandlerFunc(func(r micro.Request) {
			_ = r.Respond(answer.Data, micro.WithHeaders(headers))
		}), micro.WithEndpointSubject(echoSubject(node)))
		if err != nil {
			return nil, err
		}
	}
	return svc, nil
}

func request(nc *nats.Conn, subject, contentType string, req proto.Message) (*nats.Msg, error) {
	msg, err := message(subject, contentType, req)
	if err != nil {
		return nil, err
	}
	reply, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		return nil, err
	}
	return reply, wire.ErrorOf(reply)
}

func message(subject, contentType string, req proto.Message) (*nats.Msg, error) {
	msg := nats.NewMsg(subject)
	msg.Header.Set("Content-Type", contentType)
	var err error
	if contentType == wire.ContentTypeJSON {
		msg.Data, err = protojson.Marshal(req)
	} else {
		msg.Data, err = proto.Marshal(req)
	}
	return msg, err
}

// result is one round's latencies.
type result struct {
	took      time.Duration
	latencies []time.Duration
}

func (r result) rate() float64 { return float64(len(r.latencies)) / r.took.Seconds() }

func (r result) p99() time.Duration {
	if len(r.latencies) == 0 {
		return 0
	}
	s := slices.Clone(r.latencies)
	slices.Sort(s)
	return s[len(s)*99/100]
}

func merge(rs []result) result {
	var out result
	for _, r := range rs {
		out.took += r.took
		out.latencies = append(out.latencies, r.latencies...)
	}
	return out
}

// round runs requesters, each on its own connection, asking in a closed
// loop for d: the service's verb, or the echo.
// writes are the buckets the kinds that write put to.
type writes struct{ needs, bound jetstream.KeyValue }

func (k kind) round(url string, to writes, target string, requesters int, nodes []string, d time.Duration) (result, error) {
	var wg sync.WaitGroup
	var failed atomic.Value
	latencies := make([][]time.Duration, requesters)
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
				node := nodes[j%len(nodes)]
				req := k.request(node)
				began := time.Now()
				switch {
				case k.write:
					rev, err := to.needs.Put(context.Background(), node+".bench.port.p", nil)
					if err != nil {
						failed.Store(err)
						return
					}
					req.(*provisionerv1.ComposeRequest).MinRevisions = &provisionerv1.Revisions{Needs: rev}
				case k.bind:
					rev, err := to.bound.Put(context.Background(), "unasked.bench.p", nil)
					if err != nil {
						failed.Store(err)
						return
					}
					req.(*provisionerv1.ComposeRequest).MinRevisions = &provisionerv1.Revisions{Bound: map[string]uint64{benchBound: rev}}
				}
				subject := k.subject
				if target == "echo" {
					subject = echoSubject(node)
				}
				if _, err := request(nc, subject, k.contentType, req); err != nil {
					failed.Store(err)
					return
				}
				latencies[i] = append(latencies[i], time.Since(began))
			}
		})
	}
	wg.Wait()
	if err, ok := failed.Load().(error); ok {
		return result{}, err
	}
	return result{took: time.Since(start), latencies: slices.Concat(latencies...)}, nil
}

// benchBuckets are the buckets of a benchmark's mesh: room for its keys.
var benchBuckets = buckets.Config{MaxBytes: 8 << 30}

// Command plans (internal/bench/plans, formerly benchplans) measures issue 22's figures: how soon a node watching
// its plan (client.WatchPlan) learns that it changed. It fills a synthetic
// mesh into a nats-server with JetStream (a process of its own), starts
// the service and RunPlans (as the seat's holder runs it), and one watcher
// per node, and measures:
//
//   - a need written to one node, to that node's watcher's new composition
//     (p50, p99), against a bare KV watch's notification of a plain put on
//     the same server in the same run;
//   - a registry entry every node reads changed (written straight into the
//     registry bucket, as anyone else would; no reconciler runs to restore
//     it), to the last node notified (its new digest delivered to a watch
//     of the plans bucket), and to the last of the watchers' new
//     compositions; then the same for the entry restored by
//     registry.Reconcile;
//   - an hour's worth of registry reconciles with nothing changed: how many
//     digests the writer wrote (PlansStats.written) and whether the plans
//     stream's last sequence moved.
//
// Run it with make bench-plans, or:
//
//	go run ./internal/bench/plans -nodes 1000 -modules 30 -needs 10
//
// Machines are small and noisy: read the ratios, not the absolute figures.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"runtime/pprof"
	"slices"
	"sync"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/bench/benchnats"
	"github.com/novox/mesh-provisioner/internal/bench/meshchange"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// The goals.
const (
	goalNeedP50     = 50 * time.Millisecond
	goalNeedP99     = 250 * time.Millisecond
	goalRegistryAll = time.Second
	// Issue 38's: a need to its node's new digest while others write.
	goalLoadedP99 = 20 * time.Millisecond
)

type config struct {
	nodes, modules, needs int
	seed                  uint64
	writes                int
	pace                  time.Duration
	conns                 int
	plansInterval         time.Duration
	reconciles            int
	cpuProfile            string
	// background is how many other nodes each write a need once a second
	// while (a) is measured again.
	background int
}

func main() {
	var cfg config
	flag.IntVar(&cfg.nodes, "nodes", 1000, "nodes of the synthetic mesh, each with a watcher")
	flag.IntVar(&cfg.modules, "modules", 30, "modules per node")
	flag.IntVar(&cfg.needs, "needs", 10, "needs per module")
	flag.Uint64Var(&cfg.seed, "seed", 0, "seed of the mesh and of the nodes written to")
	flag.IntVar(&cfg.writes, "writes", 200, "needs written, each to a random node, for the need-to-watcher latency")
	flag.DurationVar(&cfg.pace, "pace", 50*time.Millisecond, "pause between two needs written")
	flag.IntVar(&cfg.conns, "conns", 8, "connections the watchers share")
	flag.DurationVar(&cfg.plansInterval, "plans-interval", service.DefaultPlansInterval, "RunPlans's interval")
	flag.IntVar(&cfg.reconciles, "reconciles", 3600, "registry reconciles with nothing changed (3600: an hour at serve's shortest --registry-interval, 1s)")
	flag.IntVar(&cfg.background, "background", 1000, "(a) again while this many nodes each write a need once a second (0: not measured)")
	flag.StringVar(&cfg.cpuProfile, "cpuprofile", "", "write a CPU profile of (b), the registry change and its restore, to this file")
	natsOnly := flag.String(benchnats.Flag, "", "internal: run only a nats-server with its store in this directory, print its URL, and serve until stdin closes")
	flag.Parse()
	if *natsOnly != "" {
		if err := benchnats.Serve(*natsOnly); err != nil {
			fmt.Fprintln(os.Stderr, "benchplans:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchplans:", err)
		os.Exit(1)
	}
}

// delivery is one composition a watcher was given.
type delivery struct {
	node  int
	at    time.Time
	needs uint64 // the needs revision it was composed at
}

func run(cfg config) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "benchplans")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
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

	// The mesh, published as the buckets' messages.
	start := time.Now()
	mesh := synth.Generate(synth.Config{Nodes: cfg.nodes, Modules: cfg.modules, Needs: cfg.needs, Seed: cfg.seed})
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
			if total%2000 == 0 { // within the client's outstanding limit
				<-js.PublishAsyncComplete()
			}
		}
	}
	<-js.PublishAsyncComplete()
	nodes := make([]string, len(mesh.Nodes))
	for i, n := range mesh.Nodes {
		nodes[i] = n.Name
	}
	kind, readers := meshchange.WidestKind(mesh)
	covered := 0
	for _, r := range readers {
		if r {
			covered++
		}
	}
	capture, mesh = nil, nil
	fmt.Printf("mesh: %d keys written in %s (%d nodes x %d modules x %d needs, with applied and collection items)\n",
		total, time.Since(start).Round(time.Millisecond), cfg.nodes, cfg.modules, cfg.needs)

	// The service, and RunPlans as the seat's holder runs it (on a
	// connection of its own, as serve's writer identity has).
	writer, err := nats.Connect(url)
	if err != nil {
		return err
	}
	defer writer.Close()
	inst, err := instance.Start(ctx, instance.Config{
		Service: service.Config{Conn: nc, WatchConn: writer, Logger: slog.New(slog.DiscardHandler), NodeMaxKeys: service.NoLimit, NodeMaxBytes: service.NoLimit},
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
	wjs, err := jetstream.New(writer)
	if err != nil {
		return err
	}
	plansKV, err := wjs.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		return err
	}
	plansCtx, stopPlans := context.WithCancel(ctx)
	plansDone := make(chan error, 1)
	go func() {
		plansDone <- svc.RunPlans(plansCtx, service.PlansConfig{KV: plansKV, Interval: cfg.plansInterval})
	}()
	defer func() {
		stopPlans()
		if err := <-plansDone; err != nil {
			fmt.Fprintln(os.Stderr, "benchplans: RunPlans:", err)
		}
	}()
	started := time.Now()
	if err := waitFor(ctx, 5*time.Minute, func() (bool, error) {
		s, err := plansStats(svc)
		return s.GetComposed() >= uint64(cfg.nodes) && s.GetPending() == 0, err
	}); err != nil {
		return fmt.Errorf("the first pass of RunPlans: %w", err)
	}
	fmt.Printf("RunPlans's first pass: %d digests written in %s\n", cfg.nodes, time.Since(started).Round(time.Millisecond))

	// A watcher per node, on a few shared connections.
	deliveries := make(chan delivery, 4*cfg.nodes)
	conns := make([]*nats.Conn, cfg.conns)
	for i := range conns {
		if conns[i], err = nats.Connect(url); err != nil {
			return err
		}
		defer conns[i].Close()
	}
	watchCtx, stopWatch := context.WithCancel(ctx)
	var watching sync.WaitGroup
	var watchErr atomic.Value
	started = time.Now()
	for i, node := range nodes {
		// Each watcher asks as its node does (AsNode: the node's own
		// subject, the only one its permissions grant).
		c := client.New(conns[i%len(conns)], client.AsNode(node))
		watching.Go(func() {
			err := c.WatchPlan(watchCtx, node, func(r *provisionerv1.ComposeResponse) error {
				deliveries <- delivery{node: i, at: time.Now(), needs: r.GetRevisions().GetNeeds()}
				return nil
			})
			if err != nil {
				watchErr.Store(fmt.Errorf("node %s: %w", node, err))
			}
		})
	}
	defer func() { stopWatch(); watching.Wait() }()
	firsts := make([]bool, len(nodes))
	if _, err := gather(deliveries, firsts, 5*time.Minute, &watchErr); err != nil {
		return fmt.Errorf("the watchers' first compositions: %w (%s)", err, diagnose(ctx, js, svc))
	}
	fmt.Printf("watchers: %d, each with its first composition, in %s, on %d connections\n", len(nodes), time.Since(started).Round(time.Millisecond), cfg.conns)

	// (a) The baseline: a bare KV watch's notification of a plain put.
	bare, err := bareWatch(ctx, js, writer, cfg)
	if err != nil {
		return fmt.Errorf("bare KV watch: %w", err)
	}
	// (b)'s baselines: what a pass that composes every node and writes
	// every digest, one after the other, costs at the least.
	seqPuts, err := sequentialPuts(ctx, js, len(nodes))
	if err != nil {
		return fmt.Errorf("sequential puts: %w", err)
	}
	storeAll, err := publishedPuts(ctx, js, len(nodes))
	if err != nil {
		return fmt.Errorf("published puts: %w", err)
	}
	seqComposes, err := sequentialComposes(ctx, client.New(conns[0]), nodes)
	if err != nil {
		return fmt.Errorf("sequential composes: %w", err)
	}
	// A node hears its new digest when it reaches its watch: one watcher
	// of the whole plans bucket sees each as the nodes' own watches do.
	notices, err := watchDigests(watchCtx, conns[0], nodes)
	if err != nil {
		return err
	}
	// (a) A need written to a node, to its new digest heard and to its
	// watcher's new composition (asked once the digest is heard).
	needsKV, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		return err
	}
	rng := rand.New(rand.NewPCG(cfg.seed, 0x62656e6368))
	// writeNeeds writes cfg.writes needs, each to a random node, and
	// returns each one's time to its new digest heard and to its
	// watcher's new composition.
	writeNeeds := func(round string) (heard, took []time.Duration, err error) {
		drain(notices)
		for w := range cfg.writes {
			i := rng.IntN(len(nodes))
			name := fmt.Sprintf("bench%s%d", round, w)
			key, err := keys.NeedKey{Node: nodes[i], Module: "bench", Kind: "port", Name: name}.Key()
			if err != nil {
				return nil, nil, err
			}
			value, err := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:" + name + "}", Required: true})
			if err != nil {
				return nil, nil, err
			}
			began := time.Now()
			rev, err := needsKV.Put(ctx, key, value)
			if err != nil {
				return nil, nil, err
			}
			at, err := waitDelivery(notices, i, rev, 10*time.Second, &watchErr)
			if err != nil {
				return nil, nil, fmt.Errorf("need %s's digest: %w", key, err)
			}
			heard = append(heard, at.Sub(began))
			at, err = waitDelivery(deliveries, i, rev, 10*time.Second, &watchErr)
			if err != nil {
				return nil, nil, fmt.Errorf("need %s: %w", key, err)
			}
			took = append(took, at.Sub(began))
			time.Sleep(cfg.pace)
		}
		return heard, took, nil
	}
	needHeard, need, err := writeNeeds("")
	if err != nil {
		return err
	}
	var loadedHeard, loaded []time.Duration
	var backgroundWrites int
	if cfg.background > 0 {
		stopBackground, err := writeInBackground(ctx, url, nodes, cfg.background)
		if err != nil {
			return err
		}
		loadedHeard, loaded, err = writeNeeds("loaded")
		backgroundWrites = stopBackground()
		if err != nil {
			return err
		}
		drain(deliveries)
	}

	// (b) A registry entry every node reads, changed.
	regKV, err := js.KeyValue(ctx, keys.RegistryBucket)
	if err != nil {
		return err
	}
	changed, err := meshchange.ChangeKind(ctx, regKV, kind)
	if err != nil {
		return err
	}
	drain(notices)
	drain(deliveries)
	notReaders := func() {
		for i, r := range readers {
			firsts[i] = !r // a node that reads no need of kind has nothing new
		}
	}
	notReaders()
	noticed := slices.Clone(firsts)
	stopProfile := func() {}
	if cfg.cpuProfile != "" {
		if stopProfile, err = profileCPU(cfg.cpuProfile); err != nil {
			return err
		}
		defer stopProfile()
	}
	began := time.Now()
	if _, err := regKV.Put(ctx, kind, changed); err != nil {
		return err
	}
	reached, err := gather(deliveries, firsts, time.Minute, &watchErr)
	if err != nil {
		return fmt.Errorf("the registry change: %w (%s)", err, diagnose(ctx, js, svc))
	}
	registryAll := reached.Sub(began)
	reached, err = gather(notices, noticed, time.Minute, &watchErr)
	if err != nil {
		return fmt.Errorf("the registry change's digests: %w (%s)", err, diagnose(ctx, js, svc))
	}
	registryNotified := reached.Sub(began)
	registryWriter, err := writerDone(svc, began)
	if err != nil {
		return err
	}
	// ... and restored by a reconcile.
	notReaders()
	noticed = slices.Clone(firsts)
	drain(notices)
	began = time.Now()
	if _, err := registry.Reconcile(ctx, regKV, registry.Table()); err != nil {
		return err
	}
	reached, err = gather(deliveries, firsts, time.Minute, &watchErr)
	if err != nil {
		return fmt.Errorf("the registry restored: %w (%s)", err, diagnose(ctx, js, svc))
	}
	restoredAll := reached.Sub(began)
	reached, err = gather(notices, noticed, time.Minute, &watchErr)
	if err != nil {
		return fmt.Errorf("the registry restored's digests: %w (%s)", err, diagnose(ctx, js, svc))
	}
	restoredNotified := reached.Sub(began)
	stopProfile()
	restoredWriter, err := writerDone(svc, began)
	if err != nil {
		return err
	}

	// (c) An hour's worth of reconciles with nothing changed.
	if err := waitFor(ctx, time.Minute, func() (bool, error) {
		s, err := plansStats(svc)
		return s.GetPending() == 0, err
	}); err != nil {
		return err
	}
	time.Sleep(10 * cfg.plansInterval) // the writer's last pass over
	before, err := plansStats(svc)
	if err != nil {
		return err
	}
	seqBefore, err := lastSeq(ctx, js, keys.PlansBucket)
	if err != nil {
		return err
	}
	regBefore, err := lastSeq(ctx, js, keys.RegistryBucket)
	if err != nil {
		return err
	}
	quiet := time.Now()
	var wrote int
	for range cfg.reconciles {
		report, err := registry.Reconcile(ctx, regKV, registry.Table())
		if err != nil {
			return err
		}
		wrote += len(report.Written) + len(report.Deleted)
	}
	quietTook := time.Since(quiet)
	time.Sleep(10 * cfg.plansInterval)
	after, err := plansStats(svc)
	if err != nil {
		return err
	}
	seqAfter, err := lastSeq(ctx, js, keys.PlansBucket)
	if err != nil {
		return err
	}
	regAfter, err := lastSeq(ctx, js, keys.RegistryBucket)
	if err != nil {
		return err
	}
	quietDeliveries := len(deliveries)
	if err, ok := watchErr.Load().(error); ok {
		return err
	}

	fmt.Printf("need written: %d needs, one every %s, to random nodes of %d (seed %d); registry kind changed: %q, read by %d of %d nodes\n",
		cfg.writes, cfg.pace, len(nodes), cfg.seed, kind, covered, len(nodes))
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "figure\tmeasured\tgoal\tmet\tbaseline (same run)\tratio")
	bp50, bp99 := quantile(bare, 50), quantile(bare, 99)
	np50, np99 := quantile(need, 50), quantile(need, 99)
	fmt.Fprintf(w, "(a) need written -> its watcher's new composition, p50\t%s\t<= %s\t%s\tbare KV put -> watch, p50 %s\t%.1f\n",
		ms(np50), goalNeedP50, met(np50 <= goalNeedP50), ms(bp50), float64(np50)/float64(bp50))
	fmt.Fprintf(w, "(a) need written -> its watcher's new composition, p99\t%s\t<= %s\t%s\tbare KV put -> watch, p99 %s\t%.1f\n",
		ms(np99), goalNeedP99, met(np99 <= goalNeedP99), ms(bp99), float64(np99)/float64(bp99))
	fmt.Fprintf(w, "(a) ... max\t%s\t\t\tbare max %s\t\n", ms(slices.Max(need)), ms(slices.Max(bare)))
	hp50, hp99 := quantile(needHeard, 50), quantile(needHeard, 99)
	fmt.Fprintf(w, "(a) need written -> its new digest heard, p50, p99\t%s, %s\t\t\tbare KV put -> watch %s, %s\t%.1f, %.1f\n",
		ms(hp50), ms(hp99), ms(bp50), ms(bp99), float64(hp50)/float64(bp50), float64(hp99)/float64(bp99))
	if len(loaded) > 0 {
		lhp50, lhp99 := quantile(loadedHeard, 50), quantile(loadedHeard, 99)
		fmt.Fprintf(w, "(a) need written -> its new digest heard while %d other nodes each write once a second, p50\t%s\t\t\tquiet p50 %s\t%.1f\n",
			cfg.background, ms(lhp50), ms(hp50), float64(lhp50)/float64(hp50))
		fmt.Fprintf(w, "(a) ... p99\t%s\t<= %s\t%s\tquiet p99 %s\t%.1f\n",
			ms(lhp99), goalLoadedP99, met(lhp99 <= goalLoadedP99), ms(hp99), float64(lhp99)/float64(hp99))
		lp50, lp99 := quantile(loaded, 50), quantile(loaded, 99)
		fmt.Fprintf(w, "(a) need written -> its watcher's new composition while %d other nodes each write once a second (%d written), p50\t%s\t\t\tquiet p50 %s\t%.1f\n",
			cfg.background, backgroundWrites, ms(lp50), ms(np50), float64(lp50)/float64(np50))
		fmt.Fprintf(w, "(a) ... p99\t%s\t\t\tquiet p99 %s\t%.1f\n",
			ms(lp99), ms(np99), float64(lp99)/float64(np99))
	}
	fmt.Fprintf(w, "(b) registry entry changed -> all %d nodes notified (the last new digest delivered)\t%s\t<= %s\t%s\tnats-server storing %d digest-sized messages from one publisher %s\t%.1f\n",
		covered, ms(registryNotified), goalRegistryAll, met(registryNotified <= goalRegistryAll), len(nodes), ms(storeAll), float64(registryNotified)/float64(storeAll))
	fmt.Fprintf(w, "(b) registry entry restored (Reconcile) -> all %d nodes notified\t%s\t<= %s\t%s\t\t\n",
		covered, ms(restoredNotified), goalRegistryAll, met(restoredNotified <= goalRegistryAll))
	fmt.Fprintf(w, "(b) ... -> all %d watchers' new compositions (each asked after its notice), changed, restored\t%s, %s\t\t\t\t\n",
		covered, ms(registryAll), ms(restoredAll))
	fmt.Fprintf(w, "(b) ... of which the writer's pass (change -> its last digest written), changed, restored\t%s, %s\t\t\t%d KV puts one after another %s; %d compose requests one after another %s\t%.2f\n",
		ms(registryWriter), ms(restoredWriter), len(nodes), ms(seqPuts), len(nodes), ms(seqComposes), float64(registryWriter)/float64(seqPuts+seqComposes))
	nothing := after.GetWritten() == before.GetWritten() && seqAfter == seqBefore && quietDeliveries == 0
	fmt.Fprintf(w, "(c) %d reconciles, nothing changed (%s): digests written\t%d (written %d -> %d)\t0\t%s\t\t\n",
		cfg.reconciles, quietTook.Round(time.Millisecond), after.GetWritten()-before.GetWritten(), before.GetWritten(), after.GetWritten(), met(nothing))
	fmt.Fprintf(w, "(c) ... plans stream last sequence\t%d -> %d\tunmoved\t%s\t\t\n", seqBefore, seqAfter, met(seqAfter == seqBefore))
	fmt.Fprintf(w, "(c) ... registry keys written, registry stream last sequence\t%d, %d -> %d\t0, unmoved\t%s\t\t\n", wrote, regBefore, regAfter, met(wrote == 0 && regAfter == regBefore))
	fmt.Fprintf(w, "(c) ... nodes composed by the writer, compositions delivered\t%d, %d\t0, 0\t%s\t\t\n",
		after.GetComposed()-before.GetComposed(), quietDeliveries, met(after.GetComposed() == before.GetComposed() && quietDeliveries == 0))
	fmt.Fprintf(w, "writer totals: written %d, composed %d, failed %d, last pass %d ms\t\t\t\t\t\n",
		after.GetWritten(), after.GetComposed(), after.GetFailed(), after.GetLastPassMs())
	return w.Flush()
}

// writeInBackground has n nodes each write a need once a second, on a
// connection of their own, spread evenly over the second, until stop,
// which returns how many were written.
func writeInBackground(ctx context.Context, url string, nodes []string, n int) (stop func() int, err error) {
	nc, err := nats.Connect(url)
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	kv, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		nc.Close()
		return nil, err
	}
	var wrote atomic.Int64
	bgCtx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		// Puts in flight, so that one slow acknowledgement does not hold
		// back the next second's writes.
		var puts errgroup.Group
		puts.SetLimit(64)
		defer func() { _ = puts.Wait() }()
		tick := time.NewTicker(time.Second / time.Duration(n))
		defer tick.Stop()
		for i := 0; ; i++ {
			select {
			case <-bgCtx.Done():
				return
			case <-tick.C:
			}
			key, err := keys.NeedKey{Node: nodes[i%min(n, len(nodes))], Module: "background", Kind: "port", Name: "churn"}.Key()
			if err != nil {
				return
			}
			value, err := proto.Marshal(&provisionerv1.Need{Placeholder: fmt.Sprintf("${port:churn%d}", i/n)})
			if err != nil {
				return
			}
			puts.Go(func() error {
				if _, err := kv.Put(bgCtx, key, value); err == nil {
					wrote.Add(1)
				}
				return nil
			})
		}
	}()
	return func() int {
		cancel()
		<-done
		nc.Close()
		return int(wrote.Load())
	}, nil
}

func met(ok bool) string {
	if ok {
		return "yes"
	}
	return "NO"
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

func quantile(ds []time.Duration, q int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*q/100)]
}

func plansStats(svc *service.Service) (*provisionerv1.PlansStats, error) {
	endpoints := svc.Stats().Endpoints
	if len(endpoints) == 0 {
		return nil, errors.New("the service has no endpoint")
	}
	// Every endpoint's data carries the same plans statistics.
	data, err := wire.DecodeStatsData(endpoints[0].Data)
	if err != nil {
		return nil, err
	}
	return data.GetPlans(), nil
}

// diagnose says what the plans stream and the writer are at, for an
// error.
func diagnose(ctx context.Context, js jetstream.JetStream, svc *service.Service) string {
	stream, err := js.Stream(ctx, wire.StreamOf(keys.PlansBucket))
	if err != nil {
		return err.Error()
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return err.Error()
	}
	stats, err := plansStats(svc)
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("the plans stream: %d consumers, max_consumers %d, last sequence %d; the writer: %v",
		info.State.Consumers, info.Config.MaxConsumers, info.State.LastSeq, stats)
}

// writerDone returns how long after began the writer wrote its last
// digest.
func writerDone(svc *service.Service, began time.Time) (time.Duration, error) {
	s, err := plansStats(svc)
	if err != nil {
		return 0, err
	}
	at, err := time.Parse(time.RFC3339Nano, s.GetLastWritten())
	if err != nil {
		return 0, fmt.Errorf("PlansStats.last_written %q: %w", s.GetLastWritten(), err)
	}
	return at.Sub(began), nil
}

func lastSeq(ctx context.Context, js jetstream.JetStream, bucket string) (uint64, error) {
	s, err := js.Stream(ctx, wire.StreamOf(bucket))
	if err != nil {
		return 0, err
	}
	info, err := s.Info(ctx)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// waitFor asks done every 5ms until it says so, for at most within.
func waitFor(ctx context.Context, within time.Duration, done func() (bool, error)) error {
	deadline := time.Now().Add(within)
	for {
		ok, err := done()
		if err != nil || ok {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("not done after %s", within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// gather reads deliveries until every node not yet in got has had one,
// and returns when the last came.
func gather(deliveries <-chan delivery, got []bool, within time.Duration, watchErr *atomic.Value) (time.Time, error) {
	left := 0
	for _, g := range got {
		if !g {
			left++
		}
	}
	var last time.Time
	timeout := time.After(within)
	check := time.NewTicker(100 * time.Millisecond)
	defer check.Stop()
	for left > 0 {
		select {
		case <-check.C:
			if err, ok := watchErr.Load().(error); ok {
				return last, err
			}
		case d := <-deliveries:
			if !got[d.node] {
				got[d.node] = true
				left--
				last = d.at
			}
		case <-timeout:
			if err, ok := watchErr.Load().(error); ok {
				return last, err
			}
			return last, fmt.Errorf("%d watchers had no composition after %s", left, within)
		}
	}
	return last, nil
}

// waitDelivery waits for node's composition (or digest) at needs
// revision rev or later, and returns when it came.
func waitDelivery(deliveries <-chan delivery, node int, rev uint64, within time.Duration, watchErr *atomic.Value) (time.Time, error) {
	timeout := time.After(within)
	check := time.NewTicker(100 * time.Millisecond)
	defer check.Stop()
	for {
		select {
		case <-check.C:
			if err, ok := watchErr.Load().(error); ok {
				return time.Time{}, err
			}
		case d := <-deliveries:
			if d.node == node && d.needs >= rev {
				return d.at, nil
			}
		case <-timeout:
			if err, ok := watchErr.Load().(error); ok {
				return time.Time{}, err
			}
			return time.Time{}, fmt.Errorf("no composition at needs revision %d after %s", rev, within)
		}
	}
}

// watchDigests watches the plans bucket from now on, and sends a delivery
// for each node's new digest, with the needs revision it is of.
func watchDigests(ctx context.Context, nc *nats.Conn, nodes []string) (<-chan delivery, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := js.KeyValue(ctx, keys.PlansBucket)
	if err != nil {
		return nil, err
	}
	watcher, err := kv.WatchAll(ctx, jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	index := make(map[string]int, len(nodes))
	for i, node := range nodes {
		index[node] = i
	}
	notices := make(chan delivery, 4*len(nodes))
	go func() {
		for e := range watcher.Updates() {
			if i, ok := index[e.Key()]; ok && e.Operation() == jetstream.KeyValuePut {
				at := time.Now()
				record := &provisionerv1.PlanDigest{}
				_ = proto.Unmarshal(e.Value(), record) // undecodable: heard, at no revision
				notices <- delivery{node: i, at: at, needs: record.GetRevisions().GetNeeds()}
			}
		}
	}()
	return notices, nil
}

func drain(deliveries <-chan delivery) {
	for {
		select {
		case <-deliveries:
		default:
			return
		}
	}
}

// sequentialPuts times n puts to a bucket of its own, each awaited
// before the next, as the writer's pass awaits each digest's write.
func sequentialPuts(ctx context.Context, js jetstream.JetStream, n int) (time.Duration, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "benchplans_puts"})
	if err != nil {
		return 0, err
	}
	began := time.Now()
	for i := range n {
		if _, err := kv.Put(ctx, fmt.Sprintf("node-%04d", i), []byte("sha256:0123456789abcdef0123456789abcdef")); err != nil {
			return 0, err
		}
	}
	return time.Since(began), nil
}

// publishedPuts times n digest-sized values put into a bucket of their
// own from one publisher, published a window at a time and awaited: what
// the server takes to store a pass's digests (issue 38's baseline).
func publishedPuts(ctx context.Context, js jetstream.JetStream, n int) (time.Duration, error) {
	if _, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "benchplans_published"}); err != nil {
		return 0, err
	}
	value := []byte("xxh3:0123456789abcdef0123456789abcdef")
	began := time.Now()
	// A window at a time, as the plans writer publishes a pass's digests.
	for start := 0; start < n; start += 1024 {
		acks := make([]jetstream.PubAckFuture, 0, 1024)
		for i := start; i < min(start+1024, n); i++ {
			ack, err := js.PublishAsync(wire.KVSubject("benchplans_published", fmt.Sprintf("node-%05d", i)), value)
			if err != nil {
				return 0, err
			}
			acks = append(acks, ack)
		}
		for _, ack := range acks {
			select {
			case <-ack.Ok():
			case err := <-ack.Err():
				return 0, err
			case <-ctx.Done():
				return 0, ctx.Err()
			}
		}
	}
	return time.Since(began), nil
}

// sequentialComposes times one compose request per node, each awaited
// before the next.
func sequentialComposes(ctx context.Context, c *client.Client, nodes []string) (time.Duration, error) {
	began := time.Now()
	for _, node := range nodes {
		if _, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: node}); err != nil {
			return 0, err
		}
	}
	return time.Since(began), nil
}

// bareWatch is the baseline: a put to a key of a bucket of its own, to
// a KV watcher's notification of it, paced as the needs are, the
// watcher on another connection than the writer's.
func bareWatch(ctx context.Context, js jetstream.JetStream, watchConn *nats.Conn, cfg config) ([]time.Duration, error) {
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "benchplans_bare"})
	if err != nil {
		return nil, err
	}
	wjs, err := jetstream.New(watchConn)
	if err != nil {
		return nil, err
	}
	wkv, err := wjs.KeyValue(ctx, "benchplans_bare")
	if err != nil {
		return nil, err
	}
	watcher, err := wkv.Watch(ctx, "k", jetstream.UpdatesOnly())
	if err != nil {
		return nil, err
	}
	defer kvread.Stop(watcher)
	var out []time.Duration
	for i := range cfg.writes {
		began := time.Now()
		rev, err := kv.Put(ctx, "k", fmt.Appendf(nil, "%d", i))
		if err != nil {
			return nil, err
		}
		for done := false; !done; {
			select {
			case e := <-watcher.Updates():
				if e != nil && e.Revision() >= rev {
					out = append(out, time.Since(began))
					done = true
				}
			case <-time.After(10 * time.Second):
				return nil, errors.New("no notification in 10s")
			}
		}
		time.Sleep(cfg.pace)
	}
	return out, nil
}

// profileCPU starts a CPU profile written to file; stop ends it.
func profileCPU(file string) (stop func(), err error) {
	f, err := os.Create(file)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		_ = f.Close()
		return nil, err
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			pprof.StopCPUProfile()
			_ = f.Close()
		})
	}, nil
}

// benchBuckets are the buckets of a benchmark's mesh: room for its keys.
var benchBuckets = buckets.Config{MaxBytes: 8 << 30}

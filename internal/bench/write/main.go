// Command write (internal/bench/write, formerly benchwrite) measures the write verbs against direct KV puts of the
// same records on the same nats-server, in one run (issue 36: the service
// is the only writer, one hop more than a direct put):
//
//   - one need put, one at a time: p50 and p99 of the put verb
//     (nodeclient.PutNeed) against a KV Put, in alternating rounds, and the
//     floor of one more hop: a bare subscription that puts and answers;
//
//   - a node applying -modules x -needs: its applies sent at once
//     (nodeclient.ApplyNeeds, each module's set changed) against the same
//     records as async KV puts, the time until the last answer or ack,
//     and the floor of one more hop: a bare subscription that publishes
//     each set asynchronously and answers;
//
//   - -nodes nodes applying -modules x -needs at once, each node its
//     modules one after another: records a second against the same
//     records as each node's async KV puts (100 nodes' at once: more
//     overrun the stream's ingest queue).
//
// Each node has a connection of its own, with its inbox prefix, as its
// grant requires in a mesh.
//
//	go run ./internal/bench/write -nodes 1000 -modules 30 -needs 10
//
// The nats-server runs in a process of its own. Machines are small and
// noisy: read the ratios, not the absolute figures.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/buckets"
	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/bench/benchnats"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

type config struct {
	nodes, modules, needs int
	puts, rounds          int
	applyRounds           int
}

func main() {
	var cfg config
	flag.IntVar(&cfg.nodes, "nodes", 1000, "nodes applying at once in the mesh figure")
	flag.IntVar(&cfg.modules, "modules", 30, "modules a node applies")
	flag.IntVar(&cfg.needs, "needs", 10, "needs a module holds")
	flag.IntVar(&cfg.puts, "puts", 2000, "puts of a latency round")
	flag.IntVar(&cfg.rounds, "rounds", 3, "rounds of each side (verb and direct) of the latency and mesh figures")
	flag.IntVar(&cfg.applyRounds, "apply-rounds", 21, "rounds of each side of the one node's figure (each some milliseconds: many, for a steady median)")
	natsOnly := flag.String(benchnats.Flag, "", "internal: run only a nats-server with its store in this directory, print its URL, and serve until stdin closes")
	flag.Parse()
	if *natsOnly != "" {
		if err := benchnats.Serve(*natsOnly); err != nil {
			fmt.Fprintln(os.Stderr, "benchwrite:", err)
			os.Exit(1)
		}
		return
	}
	if err := run(cfg); err != nil {
		fmt.Fprintln(os.Stderr, "benchwrite:", err)
		os.Exit(1)
	}
}

// bench is the run's nats-server and service, and how a node connects.
type bench struct {
	cfg config
	// connectAs opens a node's connection, with its inbox prefix as a
	// node's grant requires: its verbs and its direct puts share it.
	connectAs func(node string) (*nodeConn, error)
}

// nodeConn is a node's connection: its client of the write verbs, and the
// JetStream its direct puts go through.
type nodeConn struct {
	nc     *nats.Conn
	client *nodeclient.Client
	js     jetstream.JetStream
}

func run(cfg config) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "benchwrite")
	if err != nil {
		return err
	}
	defer func() { _ = os.RemoveAll(dir) }()
	url, stop, err := benchnats.Start(dir)
	if err != nil {
		return err
	}
	defer stop()
	var opened []*nats.Conn
	defer func() {
		for _, nc := range opened {
			nc.Close()
		}
	}()
	connect := func(opts ...nats.Option) (*nats.Conn, error) {
		nc, err := nats.Connect(url, opts...)
		if err == nil {
			opened = append(opened, nc)
		}
		return nc, err
	}
	answering, err := connect()
	if err != nil {
		return err
	}
	writer, err := connect()
	if err != nil {
		return err
	}
	js, err := jetstream.New(writer)
	if err != nil {
		return err
	}
	if err := buckets.Ensure(ctx, js, benchBuckets); err != nil {
		return err
	}
	inst, err := instance.Start(ctx, instance.Config{
		Service: service.Config{Conn: answering, WatchConn: writer, Logger: slog.New(slog.DiscardHandler), NodeMaxKeys: service.NoLimit, NodeMaxBytes: service.NoLimit,
			// Speed, not fairness: one node puts faster than its default write rate.
			MaxWriteRatePerAsker: service.NoLimit},
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
	// The floor of one more hop: a bare subscription on the answering
	// connection that stores the value with the writer's KV put and
	// answers, checking nothing.
	floorKV, err := js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		return err
	}
	if _, err := answering.Subscribe(floorSubject+".>", func(m *nats.Msg) {
		key := strings.TrimPrefix(m.Subject, floorSubject+".")
		go func() {
			_, err := floorKV.Put(ctx, key, m.Data)
			if err != nil {
				_ = m.Respond([]byte(err.Error()))
				return
			}
			_ = m.Respond(nil)
		}()
	}); err != nil {
		return err
	}
	// The same floor for an apply: the set decoded, each record published
	// asynchronously with the writer's JetStream, answered once all are
	// acknowledged; nothing compared, nothing checked.
	if _, err := answering.Subscribe(floorApplySubject, func(m *nats.Msg) {
		go func() { _ = m.Respond(floorApply(ctx, js, m.Data)) }()
	}); err != nil {
		return err
	}
	b := &bench{cfg: cfg, connectAs: func(node string) (*nodeConn, error) {
		nc, err := connect(client.Inbox(wire.RoleNode, node))
		if err != nil {
			return nil, err
		}
		c, err := nodeclient.New(ctx, nodeclient.Config{Conn: nc, Node: node})
		if err != nil {
			return nil, err
		}
		js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(1<<16))
		if err != nil {
			return nil, err
		}
		return &nodeConn{nc: nc, client: c, js: js}, nil
	}}
	fmt.Printf("benchwrite: %d nodes x %d modules x %d needs, a connection a node, %d rounds a side\n\n", cfg.nodes, cfg.modules, cfg.needs, cfg.rounds)
	if err := b.latency(ctx); err != nil {
		return err
	}
	if err := b.oneNode(ctx); err != nil {
		return err
	}
	return b.mesh(ctx)
}

// need is the value of need i of a module in round r: each round changes
// every value, so that an apply writes every record, as the direct puts do.
func need(r, i int) *provisionerv1.Need {
	return &provisionerv1.Need{Placeholder: fmt.Sprintf("${port:n%d}", i), Local: fmt.Sprintf("r%d", r)}
}

// directNodes is how many nodes put their records directly at once, in the
// mesh figure's baseline.
const directNodes = 100

// floorSubject is the bare subscription's, under which a need's key follows.
const floorSubject = "benchwrite.floor"

// floorApplySubject is the bare subscription's that stores an apply's set.
const floorApplySubject = "benchwrite.floorapply"

// floorApply stores the records of an ApplyRequest as async puts and
// returns nil once all are acknowledged, or the error's text.
func floorApply(ctx context.Context, js jetstream.JetStream, data []byte) []byte {
	in := &provisionerv1.ApplyRequest{}
	if err := proto.Unmarshal(data, in); err != nil {
		return []byte(err.Error())
	}
	acks := make([]jetstream.PubAckFuture, 0, len(in.GetNeeds()))
	for _, rec := range in.GetNeeds() {
		ack, err := js.PublishAsync(wire.KVSubject(keys.NeedsBucket, rec.GetKey()), rec.GetValue())
		if err != nil {
			return []byte(err.Error())
		}
		acks = append(acks, ack)
	}
	for _, ack := range acks {
		select {
		case <-ack.Ok():
		case err := <-ack.Err():
			return []byte(err.Error())
		case <-ctx.Done():
			return []byte(ctx.Err().Error())
		}
	}
	return nil
}

func moduleName(m int) string { return fmt.Sprintf("m%d", m) }

func needName(i int) string { return fmt.Sprintf("n%d", i) }

// latency times puts of one need, one at a time, through the verb and
// directly, in alternating rounds.
func (b *bench) latency(ctx context.Context) error {
	node, err := b.connectAs("latency")
	if err != nil {
		return err
	}
	needs, err := node.js.KeyValue(ctx, keys.NeedsBucket)
	if err != nil {
		return err
	}
	var verb, direct, floor []time.Duration
	for r := range b.cfg.rounds {
		for i := range b.cfg.puts {
			key, _ := keys.NeedKey{Node: "floor", Module: "web", Kind: "port", Name: needName(i % 100)}.Key()
			value, _ := proto.Marshal(need(r, i))
			start := time.Now()
			answer, err := node.nc.Request(floorSubject+"."+key, value, 5*time.Second)
			if err != nil {
				return err
			}
			if len(answer.Data) > 0 {
				return fmt.Errorf("the floor's put: %s", answer.Data)
			}
			floor = append(floor, time.Since(start))
		}
		for i := range b.cfg.puts {
			v := need(r, i)
			start := time.Now()
			if _, err := node.client.PutNeed(ctx, "web", "port", needName(i%100), v); err != nil {
				return err
			}
			verb = append(verb, time.Since(start))
		}
		for i := range b.cfg.puts {
			key, _ := keys.NeedKey{Node: "latency", Module: "web", Kind: "port", Name: needName(i % 100)}.Key()
			value, err := proto.Marshal(need(r, i))
			if err != nil {
				return err
			}
			start := time.Now()
			if _, err := needs.Put(ctx, key, value); err != nil {
				return err
			}
			direct = append(direct, time.Since(start))
		}
	}
	fmt.Printf("one need put, one at a time (%d a side)\n", len(verb))
	fmt.Printf("  p50: verb %s, direct KV put %s, ratio %.2f (target <= 2)\n", us(quantile(verb, 50)), us(quantile(direct, 50)), ratio(quantile(verb, 50), quantile(direct, 50)))
	fmt.Printf("  p99: verb %s, direct KV put %s, ratio %.2f\n", us(quantile(verb, 99)), us(quantile(direct, 99)), ratio(quantile(verb, 99), quantile(direct, 99)))
	fmt.Printf("  the floor of one more hop (a bare subscription that puts and answers): p50 %s, ratio %.2f to the direct put; the verb is %.2f of it\n\n",
		us(quantile(floor, 50)), ratio(quantile(floor, 50), quantile(direct, 50)), ratio(quantile(verb, 50), quantile(floor, 50)))
	return nil
}

// oneNode times a node applying all its modules at once, against async puts
// of the same records.
func (b *bench) oneNode(ctx context.Context) error {
	node, err := b.connectAs("one")
	if err != nil {
		return err
	}
	var verb, direct, floor []time.Duration
	for r := range b.cfg.applyRounds {
		took, err := b.allAtOnce(func(m int) error { return b.applyFloor(ctx, node.nc, r, m) })
		if err != nil {
			return err
		}
		floor = append(floor, took)
		if took, err = b.allAtOnce(func(m int) error { return b.apply(ctx, node.client, r, m) }); err != nil {
			return err
		}
		verb = append(verb, took)
		start := time.Now()
		if err := b.publish(ctx, node.js, "one", r); err != nil {
			return err
		}
		direct = append(direct, time.Since(start))
	}
	records := b.cfg.modules * b.cfg.needs
	fmt.Printf("a node applying %d modules x %d needs, its applies at once (median of %d)\n", b.cfg.modules, b.cfg.needs, b.cfg.applyRounds)
	fmt.Printf("  verb %s, %d direct async KV puts %s, ratio %.2f (target <= 1.5)\n", ms(quantile(verb, 50)), records, ms(quantile(direct, 50)), ratio(quantile(verb, 50), quantile(direct, 50)))
	fmt.Printf("  the floor of one more hop (a bare subscription that publishes each set and answers): %s, ratio %.2f to the direct puts; the verb is %.2f of it\n\n",
		ms(quantile(floor, 50)), ratio(quantile(floor, 50), quantile(direct, 50)), ratio(quantile(verb, 50), quantile(floor, 50)))
	return nil
}

// allAtOnce runs apply for every module at once and returns how long the
// last one took to return.
func (b *bench) allAtOnce(apply func(m int) error) (time.Duration, error) {
	start := time.Now()
	var g errgroup.Group
	for m := range b.cfg.modules {
		g.Go(func() error { return apply(m) })
	}
	err := g.Wait()
	return time.Since(start), err
}

// mesh times every node applying its modules, one after another, all nodes
// at once, against each node's async puts of the same records on its own
// connection.
func (b *bench) mesh(ctx context.Context) error {
	nodes := make([]*nodeConn, b.cfg.nodes)
	for i := range nodes {
		var err error
		if nodes[i], err = b.connectAs(fmt.Sprintf("n%05d", i)); err != nil {
			return err
		}
	}
	records := b.cfg.nodes * b.cfg.modules * b.cfg.needs
	var verb, direct []float64
	for r := range b.cfg.rounds {
		start := time.Now()
		var g errgroup.Group
		for _, node := range nodes {
			g.Go(func() error {
				for m := range b.cfg.modules {
					if err := b.apply(ctx, node.client, r, m); err != nil {
						return err
					}
				}
				return nil
			})
		}
		if err := g.Wait(); err != nil {
			return err
		}
		verb = append(verb, float64(records)/time.Since(start).Seconds())
		start = time.Now()
		// At most directNodes nodes' puts in flight: all 1,000 nodes' 300
		// at once overrun the stream's ingest queue (100,000 messages in
		// nats-server), which refuses them with a 429.
		g = errgroup.Group{}
		g.SetLimit(directNodes)
		for _, node := range nodes {
			g.Go(func() error { return b.publish(ctx, node.js, node.client.Node(), r) })
		}
		if err := g.Wait(); err != nil {
			return err
		}
		direct = append(direct, float64(records)/time.Since(start).Seconds())
	}
	slices.Sort(verb)
	slices.Sort(direct)
	v, d := verb[len(verb)/2], direct[len(direct)/2]
	fmt.Printf("%d nodes applying %d x %d at once, each its modules one after another (median of %d)\n", b.cfg.nodes, b.cfg.modules, b.cfg.needs, b.cfg.rounds)
	fmt.Printf("  verb %.0f records/s, direct async KV puts %.0f records/s, ratio %.2f (target >= 0.5)\n", v, d, v/d)
	return nil
}

// apply applies module m of round r as node.
func (b *bench) apply(ctx context.Context, node *nodeclient.Client, r, m int) error {
	needs := make([]nodeclient.ModuleNeed, b.cfg.needs)
	for i := range needs {
		needs[i] = nodeclient.ModuleNeed{Kind: "port", Name: needName(i), Need: need(r, i)}
	}
	out, err := node.ApplyNeeds(ctx, moduleName(m), needs)
	if err != nil {
		return fmt.Errorf("%s applies %s: %w", node.Node(), moduleName(m), err)
	}
	if int(out.GetWritten()) != b.cfg.needs {
		return fmt.Errorf("%s applies %s: %d written, want %d", node.Node(), moduleName(m), out.GetWritten(), b.cfg.needs)
	}
	return nil
}

// applyFloor sends module m of round r, as node "floor" would apply it,
// to the bare subscription: the same request on the same connection, the
// keys another node's than the verb's.
func (b *bench) applyFloor(ctx context.Context, nc *nats.Conn, r, m int) error {
	req := &provisionerv1.ApplyRequest{Module: moduleName(m)}
	for i := range b.cfg.needs {
		key, err := keys.NeedKey{Node: "floor", Module: moduleName(m), Kind: "port", Name: needName(i)}.Key()
		if err != nil {
			return err
		}
		value, err := proto.MarshalOptions{Deterministic: true}.Marshal(need(r, i))
		if err != nil {
			return err
		}
		req.Needs = append(req.Needs, &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: key, Value: value})
	}
	data, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second) // as the latency floor's requests
	defer cancel()
	answer, err := nc.RequestWithContext(ctx, floorApplySubject, data)
	if err != nil {
		return err
	}
	if len(answer.Data) > 0 {
		return fmt.Errorf("the floor's apply of %s: %s", moduleName(m), answer.Data)
	}
	return nil
}

// publish puts node's records of round r asynchronously on js and waits for
// every ack: what a node writing its own keys directly would do. The keys
// are another node's than the verb's (node's name with "-direct"), so that
// neither side's writes are the other's unchanged values.
func (b *bench) publish(ctx context.Context, js jetstream.JetStream, node string, r int) error {
	var acks []jetstream.PubAckFuture
	for m := range b.cfg.modules {
		for i := range b.cfg.needs {
			key, err := keys.NeedKey{Node: node + "-direct", Module: moduleName(m), Kind: "port", Name: needName(i)}.Key()
			if err != nil {
				return err
			}
			value, err := proto.Marshal(need(r, i))
			if err != nil {
				return err
			}
			ack, err := js.PublishAsync(wire.KVSubject(keys.NeedsBucket, key), value)
			if err != nil {
				return err
			}
			acks = append(acks, ack)
		}
	}
	for _, ack := range acks {
		select {
		case <-ack.Ok():
		case err := <-ack.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func quantile(ds []time.Duration, q int) time.Duration {
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*q/100)]
}

func ratio(a, b time.Duration) float64 { return float64(a) / float64(b) }

func us(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/float64(time.Millisecond)) }

// benchBuckets are the buckets of a benchmark's mesh: room for its keys.
var benchBuckets = buckets.Config{MaxBytes: 8 << 30}

package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/wire"
)

// splitFigures are one mesh's figures served by several instances, each
// --hold of an equal share of the partitions, against the one instance's
// of the same run.
type splitFigures struct {
	instances, partitions int
	rss                   []int64 // each instance's settled VmRSS, bytes
	hwm                   []int64
	heap                  []heapFigures
	start, whole          time.Duration
	p50, p99              time.Duration
	composeRate           float64
	// changed and restored are meshChange's: the last reader's new digest
	// heard after a registry entry changed, then restored.
	changed, restored wave
	// onePartition is the settled VmRSS of one more instance that serves
	// one partition alone: with the one instance's, it says what every
	// instance holds whatever its share (sharedPart).
	onePartition     int64
	onePartitionHeap heapFigures
}

// sharedPart returns, above the empty process, what every instance holds
// whatever its share (the registry, the manifests, the providers' buckets,
// what follows the whole mesh), and what one partition adds: the line
// through one partition's instance's memory and the one instance's, all P
// partitions.
func (sf *splitFigures) sharedPart(onePartition, one, empty int64) (shared, perPartition float64) {
	a1, all := float64(onePartition-empty), float64(one-empty)
	perPartition = (all - a1) / float64(sf.partitions-1)
	return a1 - perPartition, perPartition
}

// againstFair returns, for each of each, its memory above empty against
// the shared part plus the instances' share of the rest (sharedPart).
func (sf *splitFigures) againstFair(each []int64, onePartition, one, empty int64) string {
	shared, perPartition := sf.sharedPart(onePartition, one, empty)
	fair := shared + perPartition*float64(sf.partitions)/float64(sf.instances)
	out := ""
	for i, m := range each {
		if i > 0 {
			out += " "
		}
		out += fmt.Sprintf("%.2f", float64(m-empty)/fair)
	}
	return out
}

// measureSplit serves the mesh the one instance served (on url, whose
// nats-server has the partitions' mappings) by cfg.instances instances
// at once, and measures them as measure does the one: each one's settled
// memory, the first correct answer of node, every copy whole, compose
// latency and throughput (requests about another instance's nodes are
// handed on to it).
func measureSplit(cfg config, url, dir string, nc *nats.Conn, js jetstream.JetStream, names []string, node string, last *provisionerv1.Revisions, want *provisionerv1.ComposeResponse, c change) (*splitFigures, error) {
	sf := &splitFigures{instances: cfg.instances, partitions: cfg.partitions}
	share := cfg.partitions / cfg.instances
	var servers []*served
	defer func() {
		for _, srv := range servers {
			srv.stop()
		}
	}()
	for i := range cfg.instances {
		hold := fmt.Sprintf("%d-%d", i*share, (i+1)*share-1)
		if cfg.auto {
			hold = "auto"
		}
		args := []string{"--partitions", strconv.Itoa(cfg.partitions), "--hold", hold}
		if cfg.auto && cfg.expect {
			args = append(args, "--hold-expect", strconv.Itoa(cfg.instances))
		}
		srv, err := startServe(cfg, url, filepath.Join(dir, "split", strconv.Itoa(i)), args...)
		if err != nil {
			return nil, err
		}
		servers = append(servers, srv)
	}
	started := servers[0].started
	if err := firstCorrectAnswer(nc, node, last, want, started, cfg.keepServerLogs); err != nil {
		return nil, err
	}
	sf.start = time.Since(started)
	if err := allWhole(nc, cfg.instances); err != nil {
		return nil, err
	}
	sf.whole = time.Since(started)
	for _, srv := range servers {
		rss, err := settledRSS(srv.pid(), cfg.settle)
		if err != nil {
			return nil, err
		}
		hwm, _ := procStatus(srv.pid(), "VmHWM")
		heap, err := srv.heap()
		if err != nil {
			return nil, err
		}
		sf.rss, sf.hwm, sf.heap = append(sf.rss, rss), append(sf.hwm, hwm), append(sf.heap, heap)
	}
	var err error
	if sf.p50, sf.p99, err = composeLatency(nc, names, cfg.samples); err != nil {
		return nil, err
	}
	compose := func(node string) (string, string, proto.Message) {
		return wire.ComposeSubject, wire.ContentTypeJSON, &provisionerv1.ComposeRequest{Node: node}
	}
	if sf.composeRate, err = throughput(url, names, 8, cfg.round, compose); err != nil {
		return nil, err
	}
	if sf.changed, sf.restored, err = meshChange(context.Background(), js, nc, c, len(names), cfg.instances); err != nil {
		return nil, err
	}
	// One more instance, of partition 0 alone (its instance stands by):
	// the shared part.
	one, err := startServe(cfg, url, filepath.Join(dir, "split", "one"),
		"--partitions", strconv.Itoa(cfg.partitions), "--hold", "0")
	if err != nil {
		return nil, err
	}
	servers = append(servers, one)
	if err := allWhole(nc, cfg.instances+1); err != nil {
		return nil, err
	}
	if sf.onePartition, err = settledRSS(one.pid(), cfg.settle); err != nil {
		return nil, err
	}
	if sf.onePartitionHeap, err = one.heap(); err != nil {
		return nil, err
	}
	return sf, nil
}

// allWhole waits until instances processes' copies are whole: each one's
// stats name no bucket loading.
func allWhole(nc *nats.Conn, instances int) error {
	start := time.Now()
	deadline, told := start.Add(15*time.Minute), start
	for time.Now().Before(deadline) {
		whole, err := wholeInstances(nc)
		if err == nil && whole >= instances {
			return nil
		}
		if time.Since(told) >= 30*time.Second {
			told = time.Now()
			fmt.Printf("  %s: %d of %d instances' copies whole\n", time.Since(start).Round(time.Second), whole, instances)
		}
		time.Sleep(100 * time.Millisecond)
	}
	return errors.New("the instances' copies were not all whole within 15 minutes")
}

// wholeInstances counts the processes whose stats say their copy is whole:
// their data names no bucket loading.
func wholeInstances(nc *nats.Conn) (int, error) {
	all, err := processStats(nc)
	whole := 0
	for _, data := range all {
		if len(data.GetLoading()) == 0 {
			whole++
		}
	}
	return whole, err
}

// printSplit prints the figures of the meshes served by several instances.
func printSplit(all []figures) {
	if all[0].split == nil {
		return
	}
	// Issue 38 sets the split mesh's whole copies and mesh-wide change
	// against one instance's at 10,000 nodes, when the run has that size.
	var tenThousand *figures
	for i := range all {
		if all[i].nodes == 10_000 {
			tenThousand = &all[i]
		}
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "nodes\tinstances\tpartitions\tRSS MiB each\tpeak MiB each\tabove empty / (one's / instances)\tone partition's RSS MiB\tshared MiB\tabove empty / (shared + rest / instances)\theap in use (goal) MiB each\tthe same, heap in use\tthe same, heap goal (twice the live heap)\tstart\twhole\tstart / one's\twhole / one's\twhole / 10,000's one\tcompose p50\tcompose p99\tcompose req/s\tchange's last digest\trestored's\tchange / one's\tchange / 10,000's one\t")
	for _, f := range all {
		s := f.split
		if s == nil {
			continue
		}
		rss, peak, ratio, heap := "", "", "", ""
		share := float64(f.rss-f.baselineRSS) / float64(s.instances)
		shared, _ := s.sharedPart(s.onePartition, f.rss, f.baselineRSS)
		inUse, goal := make([]int64, len(s.heap)), make([]int64, len(s.heap))
		for i := range s.rss {
			sep := ""
			if i > 0 {
				sep = " "
			}
			rss += sep + fmt.Sprintf("%.0f", mib(s.rss[i]))
			peak += sep + fmt.Sprintf("%.0f", mib(s.hwm[i]))
			ratio += sep + fmt.Sprintf("%.2f", float64(s.rss[i]-f.baselineRSS)/share)
			heap += sep + s.heap[i].String()
			inUse[i], goal[i] = s.heap[i].inUse, s.heap[i].goal
		}
		wholeAgainst10k, changeAgainst10k := "-", "-"
		if tenThousand != nil {
			wholeAgainst10k = fmt.Sprintf("%.2f", float64(s.whole)/float64(tenThousand.whole))
			changeAgainst10k = ratioOf(s.changed, tenThousand.changed)
		}
		fmt.Fprintf(w, "%d\t%d\t%d\t%s\t%s\t%s\t%.0f\t%.0f\t%s\t%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%s\t%s\t%s\t%.0f\t%s\t%s\t%s\t%s\t\n",
			f.nodes, s.instances, s.partitions, rss, peak, ratio, mib(s.onePartition), shared/(1<<20),
			s.againstFair(s.rss, s.onePartition, f.rss, f.baselineRSS),
			heap, s.againstFair(inUse, s.onePartitionHeap.inUse, f.heap.inUse, f.baselineHeap.inUse),
			s.againstFair(goal, s.onePartitionHeap.goal, f.heap.goal, f.baselineHeap.goal),
			s.start.Round(time.Millisecond), s.whole.Round(time.Millisecond),
			float64(s.start)/float64(f.start), float64(s.whole)/float64(f.whole), wholeAgainst10k,
			s.p50.Round(time.Microsecond), s.p99.Round(time.Microsecond), s.composeRate,
			s.changed, s.restored, ratioOf(s.changed, f.changed), changeAgainst10k)
	}
	_ = w.Flush()
}

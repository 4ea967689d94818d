package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/wire"
)

// A node writing far past its budget (3,000 needs of 8 KB against
// --node-max-bytes 4 MiB) and asking its compose and provisioning grows
// the service's resident memory by what its budget holds, its answers and
// the heap's room to collect them, not by what it sent: at most
// budgetGrowth, issue 38's 16 MiB. It is some 13.6 MiB here: the copy's
// values (4 MiB, rounded up to the allocator's size classes), one page of
// the node's provisioning answer kept in the answer cache and nats.go's
// write buffer (each --page-max-bytes, 512 KiB), and the Go heap's goal,
// twice what is live.
func TestANodeAtItsBudgetStaysCheap(t *testing.T) {
	t.Parallel()
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("resident memory is read from /proc/<pid>/status, which this system lacks")
	}
	s := authorizedServer(t)
	host := strings.TrimPrefix(s.ClientURL(), "nats://")
	cmd := serveBinary(t, []string{"serve",
		"--nats-url", "nats://mesh-provisioner:mesh-provisioner-secret@" + host,
		"--writer-nats-url", "nats://mesh-provisioner-writer:mesh-provisioner-writer-secret@" + host,
		"--log-format", "json"}, []string{"MESH_PROVISIONER_SERVE_STATE_DIR=" + t.TempDir()})
	pid := cmd.Process.Pid
	before := settledRSS(t, pid)

	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	ace := connectAs(t, s, wire.RoleNode, "ace")
	writer, err := nodeclient.New(ctx, nodeclient.Config{Conn: ace.nc, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	const needs, size = 3000, 8 << 10
	local := strings.Repeat("x", size)
	// Under the write rate (1,000 a second), so that none is dropped.
	pace := time.NewTicker(1200 * time.Microsecond)
	defer pace.Stop()
	kept, refused := 0, 0
	for i := range needs {
		<-pace.C
		_, err := writer.PutNeed(ctx, fmt.Sprintf("m%02d", i%30), "dir", fmt.Sprintf("d%04d", i), &provisionerv1.Need{Placeholder: fmt.Sprintf("${dir:d%04d}", i), Local: local})
		switch {
		case err == nil:
			kept++
		case wire.CodeOf(err) == wire.CodeTooLarge:
			refused++
		default:
			t.Fatalf("need %d: %v", i, err)
		}
	}
	c := client.New(ace.nc, client.AsNode("ace"))
	for range 3 {
		if _, err := c.ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: "ace"}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"}); err != nil {
			t.Fatal(err)
		}
	}
	after := settledRSS(t, pid)
	grew := after - before
	t.Logf("%d needs of %d KB written, %d kept, %d refused over the budget: resident memory %d -> %d MiB (+%.1f MiB)",
		needs, size>>10, kept, refused, before>>20, after>>20, float64(grew)/(1<<20))
	if grew > budgetGrowth {
		t.Errorf("resident memory grew %.1f MiB, want at most %d MiB", float64(grew)/(1<<20), budgetGrowth>>20)
	}
}

// budgetGrowth bounds what one node at its budget adds to the service's
// resident memory: issue 38's target.
const budgetGrowth = 16 << 20

// settledRSS returns the process's resident memory once it has stayed
// within 1% for a second.
func settledRSS(t *testing.T, pid int) int64 {
	t.Helper()
	var ref int64
	since := time.Now()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		rss := residentOf(t, pid)
		if ref == 0 || rss-ref > ref/100 || ref-rss > ref/100 {
			ref, since = rss, time.Now()
			continue
		}
		if time.Since(since) >= time.Second {
			return rss
		}
	}
	return ref
}

// residentOf reads a process's VmRSS.
func residentOf(t *testing.T, pid int) int64 {
	t.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.Lines(string(data)) {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("/proc/%d/status has no VmRSS", pid)
	return 0
}

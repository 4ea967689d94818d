//go:build faults

package faults_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/seat"
	"github.com/novox/mesh-provisioner/wire"
)

// buildServe builds the mesh-provisioner binary once for the test.
func buildServe(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "mesh-provisioner")
	out, err := exec.Command("go", "build", "-o", bin, "../../../cmd/mesh-provisioner").CombinedOutput()
	if err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// supervised is one serve process, started again whenever it exits, as a
// supervisor would; every exit is recorded.
type supervised struct {
	name string
	args []string
	bin  string
	tl   *timeline

	mu       sync.Mutex
	cmd      *exec.Cmd
	stopping bool     // an exit asked for: SIGTERM
	exits    []string // unasked exits, with their code
	starts   int
	done     chan struct{}
}

func supervise(t *testing.T, bin, name string, tl *timeline, args ...string) *supervised {
	p := &supervised{name: name, args: args, bin: bin, tl: tl, done: make(chan struct{})}
	go p.loop()
	t.Cleanup(p.stop)
	return p
}

func (p *supervised) loop() {
	defer close(p.done)
	for {
		cmd := exec.Command(p.bin, p.args...)
		stderr, _ := cmd.StderrPipe()
		p.mu.Lock()
		if p.starts < 0 { // stopped for good
			p.mu.Unlock()
			return
		}
		p.cmd = cmd
		p.starts++
		p.mu.Unlock()
		if err := cmd.Start(); err != nil {
			p.mu.Lock()
			p.exits = append(p.exits, "start: "+err.Error())
			p.mu.Unlock()
			return
		}
		p.tl.read(p.name, stderr)
		err := cmd.Wait()
		p.tl.ended(p.name)
		p.mu.Lock()
		asked := p.stopping
		p.stopping, p.cmd = false, nil
		if !asked || err != nil { // a stop asked for exits 0
			p.exits = append(p.exits, fmt.Sprintf("%v (asked: %v)", err, asked))
		}
		final := p.starts < 0
		p.mu.Unlock()
		if final {
			return
		}
		time.Sleep(500 * time.Millisecond) // the supervisor's restart delay (systemd's RestartSec): pacing, not a wait
	}
}

// term asks the process to stop (SIGTERM); the supervisor starts it again.
func (p *supervised) term() {
	p.tl.stopping(p.name)
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && p.cmd.Process != nil {
		p.stopping = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
}

// stop ends the process for good.
func (p *supervised) stop() {
	p.mu.Lock()
	p.starts = -1 << 30
	if p.cmd != nil && p.cmd.Process != nil {
		p.stopping = true
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	p.mu.Unlock()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		p.mu.Lock()
		if p.cmd != nil && p.cmd.Process != nil {
			_ = p.cmd.Process.Kill()
		}
		p.mu.Unlock()
		<-p.done
	}
}

func (p *supervised) unaskedExits() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.exits)
}

// timeline follows who holds the seat from the instances' logs.
type timeline struct {
	mu      sync.Mutex
	holder  string    // the instance holding, or ""
	vacant  time.Time // since when no instance holds; zero while held
	gaps    []time.Duration
	events  []string
	took    chan string
	lostBy  map[string]int
	logTail map[string][]string
	serving map[string]bool // the instances that said "serving" since they started
	// changed is closed, and replaced, whenever the holder or an instance's
	// serving changes.
	changed chan struct{}
	// onLine and onEnded, if set before any process starts, hear each
	// log line's message and each exit too (partitionSeats).
	onLine  func(name, msg string)
	onEnded func(name string)
}

func newTimeline() *timeline {
	return &timeline{vacant: time.Now(), took: make(chan string, 64), lostBy: map[string]int{}, logTail: map[string][]string{},
		serving: map[string]bool{}, changed: make(chan struct{})}
}

// changedLocked wakes those waiting for a change.
func (tl *timeline) changedLocked() {
	close(tl.changed)
	tl.changed = make(chan struct{})
}

// waitFor waits until cond, called with the timeline locked, holds, and
// reports whether it did within timeout.
func (tl *timeline) waitFor(timeout time.Duration, cond func() bool) bool {
	deadline := time.After(timeout)
	for {
		tl.mu.Lock()
		ok, changed := cond(), tl.changed
		tl.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-changed:
		case <-deadline:
			return false
		}
	}
}

// waitHolder waits until an instance holds the seat, and returns it, or ""
// after within.
func (tl *timeline) waitHolder(within time.Duration) string {
	var h string
	tl.waitFor(within, func() bool { h = tl.holder; return h != "" })
	return h
}

// waitServing waits until every one of names has said "serving" since it
// last started, and reports whether they did within timeout.
func (tl *timeline) waitServing(timeout time.Duration, names ...string) bool {
	return tl.waitFor(timeout, func() bool {
		for _, n := range names {
			if !tl.serving[n] {
				return false
			}
		}
		return true
	})
}

// read follows one process's JSON log.
func (tl *timeline) read(name string, r io.Reader) {
	go func() {
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		// FAULTS_LOGS=<dir> keeps each process's whole log, to read
		// what a scenario's figures do not say.
		var keep *os.File
		if dir := os.Getenv("FAULTS_LOGS"); dir != "" {
			if f, err := os.OpenFile(filepath.Join(dir, name+".log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o600); err == nil {
				keep = f
				defer func() { _ = f.Close() }()
			}
		}
		for sc.Scan() {
			if keep != nil {
				_, _ = fmt.Fprintln(keep, sc.Text())
			}
			var line struct {
				Msg string `json:"msg"`
				Why string `json:"why"`
				Err string `json:"err"`
			}
			_ = json.Unmarshal(sc.Bytes(), &line)
			tl.mu.Lock()
			tail := append(tl.logTail[name], sc.Text())
			if len(tail) > 40 {
				tail = tail[1:]
			}
			tl.logTail[name] = tail
			tl.mu.Unlock()
			if tl.onLine != nil {
				tl.onLine(name, line.Msg)
			}
			switch line.Msg {
			case "took the provisioner seat":
				tl.take(name)
			case "lost the provisioner seat":
				tl.lose(name, true, line.Why)
			case "handed the provisioner seat back", "handing the provisioner seat back failed; a standby takes it when the lease expires",
				"NATS is unreachable: not handing the provisioner seat back; a standby takes it when the lease expires":
				tl.lose(name, false, strings.TrimSpace(line.Msg+" "+line.Err))
			case "serving":
				tl.mu.Lock()
				tl.serving[name] = true
				tl.changedLocked()
				tl.mu.Unlock()
				tl.note(name + ": serving")
			default:
				if strings.Contains(line.Msg, "seat") || strings.Contains(line.Msg, "reconcil") {
					tl.note(strings.TrimSpace(fmt.Sprintf("%s: %s %s", name, line.Msg, line.Err)))
				}
			}
		}
	}()
}

func (tl *timeline) take(name string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if tl.holder == "" && !tl.vacant.IsZero() {
		tl.gaps = append(tl.gaps, time.Since(tl.vacant))
	}
	tl.holder, tl.vacant = name, time.Time{}
	tl.events = append(tl.events, time.Now().Format("15:04:05.000")+" "+name+" took the seat")
	tl.changedLocked()
	select {
	case tl.took <- name:
	default:
	}
}

func (tl *timeline) lose(name string, lost bool, why string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if lost {
		tl.lostBy[name]++
	}
	if tl.holder == name {
		tl.holder, tl.vacant = "", time.Now()
		tl.changedLocked()
	}
	tl.events = append(tl.events, time.Now().Format("15:04:05.000")+" "+name+map[bool]string{true: " lost the seat: ", false: " "}[lost]+why)
}

// note adds an event.
func (tl *timeline) note(what string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.events = append(tl.events, time.Now().Format("15:04:05.000")+" "+what)
}

func (tl *timeline) ended(name string) {
	tl.stopping(name)
	tl.lose(name, false, "exited")
	if tl.onEnded != nil {
		tl.onEnded(name)
	}
}

// stopping records that name is asked to stop or has ended: it serves
// again once it says so.
func (tl *timeline) stopping(name string) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.serving[name] = false
	tl.changedLocked()
}

func (tl *timeline) current() string {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	return tl.holder
}

// TestFaultSeatFailover runs three serve processes under supervisors on a
// three-server cluster (R3 buckets), and for ten rounds stops the seat's
// holder and kills the registry stream's leader the moment a standby takes
// the seat; the stopped instance is started again at once, during the
// election. No instance may end itself, the seat may be vacant at most 10s
// in a round, the taker keeps its seat through an election shorter than its
// lease, and writes acked meanwhile are all in the copy.
//
// Where a round's vacancy goes: the stopped holder hands the seat back and a
// standby takes it within its poll (250ms); then, if the election outlasts
// the taker's fresh lease (nats-server elects in 4-9s after a kill, the
// lease is 6s), the taker stops at its lease's end by its own clock, and a
// standby (or the taker) takes the seat as soon as the stream has its new
// leader: the vacancy is about the election less the lease.
//
// vacancyGoal is issue 18's bound on a round's vacant seat.
const vacancyGoal = 10 * time.Second

func TestFaultSeatFailover(t *testing.T) {
	rounds := 10
	if testing.Short() {
		rounds = 3
	}
	bin := buildServe(t)
	c := natstest.StartCluster(t, 3)
	tl := newTimeline()
	var procs []*supervised
	for i := range 3 {
		procs = append(procs, supervise(t, bin, fmt.Sprintf("i%d", i), tl,
			"serve", "--nats-url", c.URLs(i), "--replicas", "3", "--log-format", "json", "--log-level", "info",
			"--state-dir", t.TempDir()))
	}
	registryStream := wire.StreamOf(keys.RegistryBucket)
	names := []string{"i0", "i1", "i2"}
	if tl.waitHolder(60*time.Second) == "" {
		t.Fatal("no instance took the seat within 60s of the start")
	}
	c.WaitStreamLeader(registryStream, 30*time.Second)
	if !tl.waitServing(60*time.Second, names...) {
		t.Fatal("not every instance was serving within 60s of the start")
	}
	p := newProbe(t, c.Connect(0), c.Connect(1), "w")
	stopProbe := p.run(50*time.Millisecond, 100*time.Millisecond)
	var worst time.Duration
	leasesLost, kills := 0, 0
	for round := 1; round <= rounds; round++ {
		holder := tl.current()
		tl.mu.Lock()
		gapsBefore, eventsBefore := len(tl.gaps), len(tl.events)
		tl.lostBy = map[string]int{}
		tl.mu.Unlock()
		for len(tl.took) > 0 {
			<-tl.took
		}
		idx := slices.IndexFunc(procs, func(p *supervised) bool { return p.name == holder })
		if idx < 0 {
			t.Fatalf("round %d: no holder", round)
		}
		procs[idx].term()
		var taker string
		select {
		case taker = <-tl.took:
		case <-time.After(20 * time.Second):
			t.Fatalf("round %d: no standby took the seat within 20s of the holder's stop", round)
		}
		leader := c.StreamLeader(registryStream)
		killed := time.Now()
		if leader >= 0 {
			c.Kill(leader)
		}
		tl.note(fmt.Sprintf("test: registry leader s%d killed", leader))
		newLeader := c.WaitStreamLeader(registryStream, 30*time.Second)
		elected := time.Since(killed)
		tl.note(fmt.Sprintf("test: new registry leader s%d", newLeader))
		// The fault's shape: the killed server stays down 3s after the
		// election, as a crashed host would, before it comes back.
		time.Sleep(3 * time.Second) // the fault's shape: down this long, not a wait for a condition
		if leader >= 0 {
			c.Start(leader)
			c.WaitMetaLeader(30 * time.Second)
			c.WaitStreamLeader(registryStream, 30*time.Second)
		}
		if tl.waitHolder(20*time.Second) == "" {
			t.Fatalf("round %d: nobody holds the seat 20s after the election", round)
		}
		tl.mu.Lock()
		var roundWorst time.Duration
		for _, g := range tl.gaps[gapsBefore:] {
			roundWorst = max(roundWorst, g)
		}
		kept := tl.lostBy[taker] == 0
		events := slices.Clone(tl.events[eventsBefore:])
		lost := 0
		for _, n := range tl.lostBy {
			lost += n
		}
		tl.mu.Unlock()
		worst = max(worst, roundWorst)
		leasesLost += lost
		kills++
		t.Logf("round %d: %s stopped, %s took the seat; registry leader s%d killed, new leader s%d after %s; seat vacant at most %s; %s kept the seat: %v (leases lost this round: %d)",
			round, holder, taker, leader, newLeader, elected.Round(time.Millisecond), roundWorst.Round(time.Millisecond), taker, kept, lost)
		if roundWorst > 2*time.Second || !kept {
			t.Logf("round %d's seat events:\n\t%s", round, strings.Join(events, "\n\t"))
		}
		if roundWorst > vacancyGoal && !raceEnabled { // a speed claim: logged above under -race
			t.Errorf("round %d: GOAL MISSED: the seat was vacant %s, more than the %s goal", round, roundWorst.Round(time.Millisecond), vacancyGoal)
		}
		// The taker's lease is fresh when the leader is killed: it keeps
		// its seat through any election that ends before the lease does.
		// The lease runs from the last renewal that landed, which may be a
		// renewal interval (TTL/12) older than the kill, and a renewal
		// needs up to a second to land on the new leader.
		if !kept && elected < seat.DefaultTTL-seat.DefaultTTL/12-time.Second {
			t.Errorf("round %d: %s lost its seat through an election of %s, shorter than its lease (%s)", round, taker, elected.Round(time.Millisecond), seat.DefaultTTL)
		}
		// The next round starts once the stopped instance is serving again.
		if !tl.waitServing(60*time.Second, names...) {
			t.Fatalf("round %d: not every instance was serving again within 60s", round)
		}
	}
	stopProbe()
	var exits []string
	for _, p := range procs {
		for _, e := range p.unaskedExits() {
			exits = append(exits, p.name+": "+e)
		}
	}
	p.mu.Lock()
	acked, failed := len(p.acked), len(p.failed)
	p.mu.Unlock()
	t.Logf("%d rounds: worst vacancy %s; leases lost through %d leader kills: %d; %d instance exits not asked for; %d writes acked, %d failed",
		rounds, worst.Round(time.Millisecond), kills, leasesLost, len(exits), acked, failed)
	t.Logf("GOAL seat vacant <= %s in every round: worst %s (held to it without the race detector only: %v)", vacancyGoal, worst.Round(time.Millisecond), !raceEnabled)
	if len(exits) > 0 {
		tl.mu.Lock()
		for name, tail := range tl.logTail {
			fmt.Fprintf(os.Stderr, "--- last log lines of %s:\n", name)
			for _, l := range tail {
				fmt.Fprintln(os.Stderr, l)
			}
		}
		tl.mu.Unlock()
		t.Errorf("instances ended themselves: %v", exits)
	}
	checkCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	p.checkCopy(checkCtx, c.Connect(2))
}

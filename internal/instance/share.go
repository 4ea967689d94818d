package instance

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"time"

	"github.com/nats-io/nats.go/micro"
	"github.com/zeebo/xxh3"

	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// Sharing the partitions (Config.SharePartitions, serve --hold auto). Each
// instance that shares them tells its name, its seat's id, in its micro
// instance's metadata, and asks micro discovery every shareEvery which
// others do and which partitions each serves. The partitions are dealt among
// the members by rendezvous hashing bounded to a fair share each (deal), so
// that a member coming or going moves little besides its own share. A member takes its share on (service.Service.Hold: its copy reads
// their nodes, then it serves them), and lets a partition go only once the
// member it is dealt to serves it: a partition moves without a moment
// unserved, and its plans are written by the holder of its seat alone,
// which the old holder hands back as it lets go. A member is taken for gone
// once goneAfter rounds of discovery in a row have not heard of it
// (roster); its share is then dealt among the others, who read it before
// they serve it.
const (
	shareEvery = time.Second
	// discoverFor is how long a round of discovery gathers answers.
	discoverFor = 500 * time.Millisecond
)

// deal returns, by partition of n, the members (of members, not empty)
// it is dealt to, copies of them (at most every member). Its first goes to
// the member whose hash of it is highest among those not yet dealt their
// fair share (n over the members, some one more to deal them all),
// partitions in order; its others to the members after that one in name
// order, round the ring. Rendezvous hashing alone deals 16 partitions among
// four as unevenly as 2 and 5 (bench-scale -auto); bounded so, a member
// coming or going still moves few partitions besides its own, and each
// member's copies follow its neighbour's share, as even.
func deal(members []string, n, copies int) [][]string {
	members = slices.Compact(slices.Sorted(slices.Values(members)))
	copies = max(min(copies, len(members)), 1)
	fair, extra := n/len(members), n%len(members)
	dealt := make([]int, len(members))
	owners := make([][]string, n)
	for p := range owners {
		suffix := "/" + strconv.Itoa(p)
		first, top := -1, uint64(0)
		for i, m := range members {
			room := dealt[i] < fair || (dealt[i] == fair && extra > 0)
			if score := xxh3.HashString(m + suffix); room && (first < 0 || score > top) {
				first, top = i, score
			}
		}
		if dealt[first]++; dealt[first] > fair {
			extra--
		}
		for k := range copies {
			owners[p] = append(owners[p], members[(first+k)%len(members)])
		}
	}
	return owners
}

// shareOf returns the partitions of n dealt to me among members, copies
// members a partition.
func shareOf(me string, members []string, n, copies int) []int {
	share := []int{}
	for p, owners := range deal(members, n, copies) {
		if slices.Contains(owners, me) {
			share = append(share, p)
		}
	}
	return share
}

// firstShareRounds is how many rounds of discovery an instance that starts
// gathers the members from: instances started together, which announce
// themselves at once, hear each other before each deals itself a share.
const firstShareRounds = 3

// expectEvery is how long a round of the first share's discovery lasts
// when the instance expects a number of members (Config.ShareExpect): it
// deals itself its share at the end of the first round that heard them
// all, and gathers for as long in all as the rounds without it.
const expectEvery = 100 * time.Millisecond

// announce adds the micro instance that tells the instances sharing the
// partitions that this one is among them: no endpoint, its name in its
// metadata (wire.MemberMetadata). It is stopped when the instance leaves
// (handOver, Stop).
func (in *Instance) announce() error {
	svc, err := micro.AddService(in.cfg.Service.Conn, micro.Config{
		Name: wire.ServiceName, Version: cmp.Or(in.cfg.Service.Version, "0.0.0"),
		Description: "An instance among those that share the mesh's partitions (serve --hold auto).",
		Metadata: map[string]string{wire.MemberMetadata: in.seat.ID(),
			wire.PartitionsMetadata: strconv.Itoa(in.cfg.Service.Partitions)},
	})
	if err != nil {
		return fmt.Errorf("announce the instance among those sharing the partitions: %w", err)
	}
	in.announced.Store(&svc)
	return nil
}

// leave stops announcing the instance: the others deal its partitions
// among themselves.
func (in *Instance) leave() {
	if svc := in.announced.Swap(nil); svc != nil {
		if err := (*svc).Stop(); err != nil {
			in.logger.Warn("leaving the instances that share the partitions", "err", err)
		}
	}
}

// firstShare announces the instance, unless it did already (a start tried
// again), and returns the partitions it starts with: its share among the
// members discovery hears of in its first rounds, or as soon as it has
// heard the members it expects (Config.ShareExpect). The service calls it
// once it has bound the buckets (service.Config.FirstHold): nats-server
// answers those requests only when no other API request waits, and the
// others, which count this instance in from now on, already make
// consumers of their shares. Bound after, its share was served by no
// instance until 6.5-7.2 s after four instances started on 100,000 nodes
// in two runs of three (bench-scale -auto).
func (in *Instance) firstShare(ctx context.Context) ([]int, error) {
	if in.announced.Load() == nil {
		if err := in.announce(); err != nil {
			return nil, err
		}
	}
	me, expect := in.seat.ID(), in.cfg.ShareExpect
	round, rounds := discoverFor, firstShareRounds
	if expect > 0 {
		round, rounds = expectEvery, firstShareRounds*int(discoverFor/expectEvery)
	}
	heard := map[string]bool{me: true}
	gathered := 0
	for ; gathered < rounds && (expect == 0 || len(heard) < expect); gathered++ {
		dctx, cancel := context.WithTimeout(ctx, round)
		// A failed discovery hears no member.
		peers, _ := service.DiscoverPeers(dctx, in.cfg.Service.Conn, in.cfg.Service.Partitions)
		<-dctx.Done() // a round lasts its time, answers or not
		cancel()
		for _, m := range peers.Members {
			heard[m] = true
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	in.roster = newRoster(me, slices.Collect(maps.Keys(heard)))
	members := in.roster.members()
	share := shareOf(me, members, in.cfg.Service.Partitions, in.copies())
	if len(members) < expect {
		in.logger.Warn("sharing the partitions: fewer instances heard than --hold-expect says; dealing among those heard, who deal again as the others come",
			"members", len(members), "expected", expect, "gathered_for", time.Duration(gathered)*round)
	}
	in.logger.Info("sharing the partitions", "members", len(members), "share", share, "rounds", gathered)
	return share, nil
}

// share keeps the instance's share of the partitions as members come and
// go, until ctx ends.
func (in *Instance) share(ctx context.Context) error {
	if err := in.svc.WaitReady(ctx); err != nil {
		return nil // stopped while loading
	}
	me, n := in.seat.ID(), in.cfg.Service.Partitions
	strangers := ""
	tick := time.NewTicker(shareEvery)
	defer tick.Stop()
	for {
		dctx, cancel := context.WithTimeout(ctx, discoverFor)
		peers, err := service.DiscoverPeers(dctx, in.cfg.Service.Conn, n)
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			in.logger.Warn("sharing the partitions: discovery failed; what is held stays", "err", err)
		default:
			in.warnStrangers(peers.Strangers, &strangers)
			in.roster.heard(peers)
			members := in.roster.members()
			in.seatsToFirst(me, members, peers)
			if target := in.target(me, members, peers); !slices.Equal(target, in.svc.Held()) {
				in.logger.Info("sharing the partitions: what this instance serves changes",
					"members", len(members), "serves", in.svc.Held(), "to_serve", target)
				in.hold(ctx, target)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// warnStrangers logs the members of another number of partitions
// (service.Peers.Strangers) whenever who they are changes, last being what
// it said before: each of them and this instance serve, and write the plans
// of, what each takes for a partition, the same nodes among them.
func (in *Instance) warnStrangers(strangers map[string]int, last *string) {
	said := fmt.Sprint(strangers) // in key order
	if said == *last {
		return
	}
	*last = said
	if len(strangers) > 0 {
		in.logger.Error("sharing the partitions: other instances split the mesh into another number of partitions, and share nothing with this one; give every instance the --partitions of nats-server's mappings",
			"partitions", in.cfg.Service.Partitions, "others", strangers)
	}
}

// target returns the partitions the instance is to serve now (targetOf).
func (in *Instance) target(me string, members []string, peers service.Peers) []int {
	return targetOf(me, members, peers, in.cfg.Service.Partitions, in.copies(), in.svc.HoldsPartition)
}

// seatsToFirst records, by partition, whether another member, the first
// it is dealt to, serves it (Instance.firstServes), and wakes the seats'
// keepers when that changed.
func (in *Instance) seatsToFirst(me string, members []string, peers service.Peers) {
	first := make([]bool, in.cfg.Service.Partitions)
	for p, owners := range deal(members, len(first), in.copies()) {
		first[p] = owners[0] != me && peers.Serves(owners[0], p)
	}
	if old := in.firstServes.Swap(&first); old == nil || !slices.Equal(*old, first) {
		in.tellHeldMoved()
	}
}

// copies is how many members serve each partition (Config.ShareCopies).
func (in *Instance) copies() int { return max(in.cfg.ShareCopies, 1) }

// targetOf returns the partitions of n that member me is to serve now, of
// members, copies members a partition, where serves says what it serves:
// those dealt to it, and those it serves that a member they are dealt to
// does not serve yet.
func targetOf(me string, members []string, peers service.Peers, n, copies int, serves func(p int) bool) []int {
	target := []int{}
	for p, owners := range deal(members, n, copies) {
		waiting := slices.ContainsFunc(owners, func(m string) bool { return !peers.Serves(m, p) })
		if slices.Contains(owners, me) || (serves(p) && waiting) {
			target = append(target, p)
		}
	}
	return target
}

// hold has the service serve target: it lets go first, and hands the seats
// of what it let go back at once, then reads and serves what it takes on.
func (in *Instance) hold(ctx context.Context, target []int) {
	kept := slices.DeleteFunc(slices.Clone(in.svc.Held()), func(p int) bool { return !slices.Contains(target, p) })
	for _, step := range [][]int{kept, target} {
		if slices.Equal(step, in.svc.Held()) {
			continue
		}
		if err := in.svc.Hold(ctx, step); err != nil {
			if ctx.Err() == nil {
				in.logger.Warn("sharing the partitions: changing what is served failed; trying again", "err", err)
			}
			return
		}
		in.tellHeldMoved()
	}
}

// serving returns the members that serve some partition.
func serving(peers service.Peers) map[string]bool {
	out := map[string]bool{}
	for _, members := range peers.Serving {
		for _, m := range members {
			out[m] = true
		}
	}
	return out
}

// handOverEvery is how long a leaving instance pauses between rounds of
// asking whether the others serve its partitions yet.
const handOverEvery = 250 * time.Millisecond

// handOver has the instance leave those sharing the partitions, and serve
// on until the others serve every partition it serves, there are no
// others, or within (the others read the partitions before they serve
// them) passes. There are no others once the roster, which the share loop
// kept, has taken each for gone: a round whose answers come late is not
// taken for the others' absence.
func (in *Instance) handOver(ctx context.Context, within time.Duration) {
	in.leave()
	held := in.svc.Held()
	if len(held) == 0 {
		return
	}
	in.logger.Info("sharing the partitions: handing them over before stopping", "serves", held, "within", within)
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	me, started := in.seat.ID(), time.Now()
	for {
		dctx, dcancel := context.WithTimeout(ctx, discoverFor)
		peers, err := service.DiscoverPeers(dctx, in.cfg.Service.Conn, in.cfg.Service.Partitions)
		dcancel()
		if err == nil {
			in.roster.heard(peers)
			others := slices.DeleteFunc(slices.Clone(peers.Members), func(m string) bool { return m == me })
			if in.roster.others() == 0 {
				in.logger.Warn("sharing the partitions: no other instance shares them; stopping without handing them over", "serves", held)
				return
			}
			waiting := slices.DeleteFunc(slices.Clone(held), func(p int) bool {
				return slices.ContainsFunc(others, func(m string) bool { return peers.Serves(m, p) })
			})
			if len(waiting) == 0 {
				in.logger.Info("sharing the partitions: handed over", "took", time.Since(started).Round(time.Millisecond))
				return
			}
		}
		select {
		case <-ctx.Done():
			in.logger.Warn("sharing the partitions: not all handed over in time; stopping", "within", within)
			return
		case <-time.After(handOverEvery):
		}
	}
}

package service

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/wire"
)

// discover asks micro discovery ($SRV.INFO) of the service's name, which
// every micro instance of every process answers, and hands each answer to
// each until it says it has heard enough, ctx ends (nil), or no instance
// answers at all (nats-server's "no responders", at once: nil). The
// answering identity may ask this and nothing else (permissions.Server),
// and the answers come to its own inbox.
func discover(ctx context.Context, nc *nats.Conn, each func(micro.Info) (enough bool)) error {
	subject, err := micro.ControlSubject(micro.InfoVerb, wire.ServiceName, "")
	if err != nil {
		return err
	}
	// The answering identity's own inbox, which only it may subscribe to:
	// the connection's default inbox stays nats.go's, for whatever else
	// shares the connection.
	inbox := wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity) + "." + strings.TrimPrefix(nats.NewInbox(), "_INBOX.")
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return err
	}
	for {
		msg, err := sub.NextMsgWithContext(ctx)
		switch {
		case ctx.Err() != nil:
			return nil // waited long enough
		case err != nil:
			return err
		case msg.Header.Get("Status") == "503":
			return nil // no responders
		}
		var info micro.Info
		if json.Unmarshal(msg.Data, &info) != nil {
			continue
		}
		if each(info) {
			return nil
		}
	}
}

// Peers is what micro discovery tells of the instances that share a mesh's
// partitions among themselves (Config.Member).
type Peers struct {
	// Members are the names of those that announce themselves (a micro
	// instance of no endpoint, whose metadata names it,
	// wire.MemberMetadata), in order: one that leaves stops announcing.
	Members []string
	// Serving says, by partition, which of them serve it: its micro
	// instance or its relay endpoints are open. A member leaving serves
	// on until it has handed its partitions over.
	Serving [][]string
	// Strangers are the members that split the mesh into another number
	// of partitions (wire.PartitionsMetadata), with theirs: they are in
	// neither Members nor Serving, since their partitions are not these.
	Strangers map[string]int
}

// Serves reports whether member serves partition p.
func (ps Peers) Serves(member string, p int) bool {
	return p >= 0 && p < len(ps.Serving) && slices.Contains(ps.Serving[p], member)
}

// ErrNoDiscovery says a discovery could not be asked; its wrapped error
// says why.
var ErrNoDiscovery = errors.New("service: micro discovery could not be asked")

// DiscoverPeers asks micro discovery, on nc (the answering identity's
// connection), which instances share the partitions of a mesh of
// partitions, and which partitions each serves, from the answers heard
// until ctx ends. A member of another number of partitions is a stranger.
func DiscoverPeers(ctx context.Context, nc *nats.Conn, partitions int) (Peers, error) {
	peers := Peers{Serving: make([][]string, partitions)}
	err := discover(ctx, nc, func(info micro.Info) bool {
		member := info.Metadata[wire.MemberMetadata]
		if member == "" {
			return false
		}
		if count, ok := info.Metadata[wire.PartitionsMetadata]; ok && count != strconv.Itoa(partitions) {
			if peers.Strangers == nil {
				peers.Strangers = map[string]int{}
			}
			peers.Strangers[member], _ = strconv.Atoi(count)
			return false
		}
		index, ok := info.Metadata["partition"]
		if !ok {
			peers.Members = append(peers.Members, member)
			return false
		}
		if p, err := strconv.Atoi(index); err == nil && p >= 0 && p < partitions && !slices.Contains(peers.Serving[p], member) {
			peers.Serving[p] = append(peers.Serving[p], member)
		}
		return false
	})
	if err != nil {
		return Peers{}, errors.Join(ErrNoDiscovery, err)
	}
	slices.Sort(peers.Members)
	peers.Members = slices.Compact(peers.Members)
	return peers, nil
}

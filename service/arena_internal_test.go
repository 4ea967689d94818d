package service

import (
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/service/plans"
	"github.com/novox/mesh-provisioner/wire"
)

// Compositions are made in arenas reused once their answers are encoded
// (or their digests read): answers asked at once and in turn, in both
// encodings, while the plans writer composes too, are each what a
// composition made in an arena of its own is.
func TestAnswersFromReusedArenasAreTheirOwn(t *testing.T) {
	t.Parallel()
	s, mesh, nc := startOnMesh(t, synth.Config{Nodes: 8, Modules: 6, Needs: 5, Builds: 30, Bound: 50}, Config{NoAnswerCache: true})
	want := map[string]*provisionerv1.ComposeResponse{}
	for _, n := range mesh.Nodes {
		// Asked once first: the copy reads the providers' buckets a node's
		// needs name when it is first asked for.
		if _, err := askCompose(nc, n.Name, false); err != nil {
			t.Fatal(err)
		}
		out, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: n.Name}, encoding{}, unpaged, reading{views: keepViews})
		if werr != nil {
			t.Fatal(werr)
		}
		want[n.Name] = out
	}
	var wg sync.WaitGroup
	for asker := range 4 {
		wg.Go(func() {
			for round := range 3 {
				for i := range mesh.Nodes {
					// Each asker in its own order, in both encodings.
					node := mesh.Nodes[(i*(2*asker+1)+round)%len(mesh.Nodes)].Name
					got, err := askCompose(nc, node, (i+asker)%2 == 0)
					if err != nil {
						t.Error(err)
						return
					}
					if diff := cmp.Diff(want[node], got, protocmp.Transform(),
						protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases", "revisions")); diff != "" {
						t.Errorf("asker %d, round %d: %s composed (-alone +asked):\n%s", asker, round, node, diff)
						return
					}
				}
				plans.Compose(s.mirror, mesh.Nodes[round].Name)
			}
		})
	}
	wg.Wait()
}

// askCompose asks the compose verb for node, in JSON or binary.
func askCompose(nc *nats.Conn, node string, asJSON bool) (*provisionerv1.ComposeResponse, error) {
	req := &provisionerv1.ComposeRequest{Node: node}
	msg := nats.NewMsg(wire.ComposeSubject)
	var err error
	if asJSON {
		msg.Header.Set("Content-Type", wire.ContentTypeJSON)
		msg.Data, err = protojson.Marshal(req)
	} else {
		msg.Header.Set("Content-Type", wire.ContentTypeProtobuf)
		msg.Data, err = proto.Marshal(req)
	}
	if err != nil {
		return nil, err
	}
	reply, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		return nil, err
	}
	got := &provisionerv1.ComposeResponse{}
	if asJSON {
		return got, protojson.Unmarshal(reply.Data, got)
	}
	return got, proto.Unmarshal(reply.Data, got)
}

package answers

import (
	"sync"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/service/plans"
)

// Compositions are made in arenas reused once their answers are encoded
// (or their digests read): answers asked at once and in turn, in both
// encodings, while the plans writer composes too, are each what a
// composition made in an arena of its own is.
func TestAnswersFromReusedArenasAreTheirOwn(t *testing.T) {
	t.Parallel()
	s, mesh, _ := startOnMesh(t, synth.Config{Nodes: 8, Modules: 6, Needs: 5, Builds: 30, Bound: 50}, func(c *Config) { c.CacheMaxBytes = 0 })
	want := map[string]*provisionerv1.ComposeResponse{}
	for _, n := range mesh.Nodes {
		// Asked once first: the copy reads the providers' buckets a node's
		// needs name when it is first asked for.
		if _, err := askCompose(s, n.Name, false); err != nil {
			t.Fatal(err)
		}
		out, _, werr := composeFrom(s.mirror, &provisionerv1.ComposeRequest{Node: n.Name}, Encoding{}, unpaged, reading{views: keepViews})
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
					got, err := askCompose(s, node, (i+asker)%2 == 0)
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

package wire_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/micro"

	"github.com/novox/mesh-provisioner/wire"
)

// PartitionedSubject agrees with nats-server's own mappings, for every
// addressed verb, across names and partition counts.
func TestPartitionedSubjectIsNatsServersMapping(t *testing.T) {
	t.Parallel()
	for _, n := range []int{1, 2, 7, 16, wire.MaxPartitions} {
		for _, m := range wire.PartitionMappings(n) {
			transform, err := server.NewSubjectTransform(m.Source, m.Destination)
			if err != nil {
				t.Fatalf("mapping %s -> %s: %v", m.Source, m.Destination, err)
			}
			for i := range 200 {
				name := fmt.Sprintf("node-%d", i*7919)
				subject := m.Source[:len(m.Source)-1] + name
				if len(m.Source) > 2 && m.Source[len(m.Source)-3:] == "*.*" {
					subject = m.Source[:len(m.Source)-3] + name + ".postgres"
				}
				want, err := transform.Match(subject)
				if err != nil {
					t.Fatalf("nats-server maps %s: %v", subject, err)
				}
				if got := wire.PartitionedSubject(subject, n); got != want {
					t.Fatalf("PartitionedSubject(%q, %d) = %q, nats-server maps it to %q", subject, n, got, want)
				}
			}
		}
	}
}

// A node's compose subject, in a mesh of 8 partitions, as nats-server maps
// it.
func ExamplePartitionedSubject() {
	fmt.Println(wire.PartitionedSubject(wire.NodeSubject(wire.ComposeSubject, "ace"), 8))
	fmt.Println(wire.PartitionedSubject(wire.DeclareSubjectOf("ace", "postgres"), 8))
	fmt.Println(wire.PartitionedSubject(wire.ComposeSubject, 8))
	// Output:
	// mesh-provisioner.compose.ace.0
	// mesh-provisioner.declare.ace.postgres.0
	// mesh-provisioner.compose
}

// An instance's partitions fold into its stats: each addressed endpoint
// once, its micro counts summed, on the subject with "*" for the
// partition.
func TestFoldPartitions(t *testing.T) {
	t.Parallel()
	instance := micro.Stats{Endpoints: []*micro.EndpointStats{{Name: "compose", Subject: "mesh-provisioner.compose", NumRequests: 1}}}
	partition := func(p string, requests, errs int, took time.Duration) micro.Stats {
		return micro.Stats{Endpoints: []*micro.EndpointStats{{Name: "compose-node", Subject: "mesh-provisioner.compose.*." + p,
			NumRequests: requests, NumErrors: errs, ProcessingTime: took, Data: []byte(`{}`)}}}
	}
	got := wire.FoldPartitions(instance, []micro.Stats{partition("0", 3, 1, 3*time.Millisecond), partition("1", 1, 0, 5*time.Millisecond)})
	want := []*micro.EndpointStats{
		{Name: "compose", Subject: "mesh-provisioner.compose", NumRequests: 1},
		{Name: "compose-node", Subject: "mesh-provisioner.compose.*.*", NumRequests: 4, NumErrors: 1,
			ProcessingTime: 8 * time.Millisecond, AverageProcessingTime: 2 * time.Millisecond, Data: []byte(`{}`)},
	}
	if diff := cmp.Diff(want, got.Endpoints); diff != "" {
		t.Errorf("folded endpoints (-want +got):\n%s", diff)
	}
}

// A request handed to a partition's holder is asked on its relay subject,
// and read as it was asked.
func ExampleRelaySubject() {
	relayed := wire.RelaySubject(3, wire.ProviderSubject("postgres"))
	fmt.Println(relayed)
	fmt.Println(wire.Unrelayed(relayed))
	fmt.Println(wire.Unrelayed(wire.ComposeSubject))
	// Output:
	// mesh-provisioner.partition.provisions.postgres.3
	// mesh-provisioner.provisions.postgres 3 true
	//  0 false
}

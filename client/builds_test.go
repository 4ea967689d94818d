package client_test

import (
	"fmt"
	"testing"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

func ExamplePlanAt() {
	// web is moving from build b1 to b2: port:http is in both, port:old
	// only in b1, port:quic only in b2.
	plan := &provisionerv1.ModulePlan{Module: "web", WantedBuild: "b1", NewestBuild: "b2", Items: []*provisionerv1.PlanItem{
		{Kind: "port", Name: "http", Builds: []string{"b1", "b2"}},
		{Kind: "port", Name: "old", Builds: []string{"b1"}},
		{Kind: "port", Name: "quic", Builds: []string{"b2"}},
	}}
	for _, build := range []string{plan.GetWantedBuild(), plan.GetNewestBuild()} {
		fmt.Print(build, ":")
		for _, item := range client.PlanAt(plan, build) {
			fmt.Print(" ", item.GetName())
		}
		fmt.Println()
	}
	// Output:
	// b1: http old
	// b2: http quic
}

func TestPlanAt(t *testing.T) {
	t.Parallel()
	between := &provisionerv1.ModulePlan{WantedBuild: "b1", NewestBuild: "b2", Items: []*provisionerv1.PlanItem{
		{Name: "both", Builds: []string{"b1", "b2"}}, {Name: "old", Builds: []string{"b1"}},
	}}
	unbuilt := &provisionerv1.ModulePlan{Items: []*provisionerv1.PlanItem{{Name: "a"}, {Name: "b"}}}
	tests := []struct {
		name  string
		plan  *provisionerv1.ModulePlan
		build string
		want  int
	}{
		{"the wanted build", between, "b1", 2},
		{"the newest build", between, "b2", 1},
		{"a build of neither", between, "b0", 0},
		{"a plan without builds holds every item at any build", unbuilt, "b9", 2},
		{"a plan without builds, asked at none", unbuilt, "", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := len(client.PlanAt(tt.plan, tt.build)); got != tt.want {
				t.Errorf("PlanAt(%s) has %d items, want %d", tt.build, got, tt.want)
			}
		})
	}
}

func TestPending(t *testing.T) {
	t.Parallel()
	c := &provisionerv1.ComposeResponse{Provisions: []*provisionerv1.Provision{{Key: "a", BoundRevision: 4}, {Key: "b"}}}
	if got := client.Pending(c); len(got) != 1 || got[0].GetKey() != "b" {
		t.Errorf("Pending = %v, want b alone", got)
	}
}

package compose_test

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/registry"
)

func TestCompose(t *testing.T) {
	t.Parallel()
	entries := map[string]*provisionerv1.RegistryEntry{}
	for _, e := range registry.Table() {
		entries[e.GetKind()] = e
	}
	need := func(module, kind, name string, n *provisionerv1.Need) *provisionerv1.NeedRecord {
		if n == nil {
			n = &provisionerv1.Need{}
		}
		return &provisionerv1.NeedRecord{Node: "ace", Module: module, Kind: kind, Name: name, Need: n, Revision: 7}
	}
	items := []*provisionerv1.CollectRecord{{Node: "ace", Collection: "shell:zsh:normal", Contributor: "web", Item: &provisionerv1.CollectItem{Value: "a"}, Revision: 3}}
	bucket := func(b, k string) *provisionerv1.PlanItem_Bucket {
		return &provisionerv1.PlanItem_Bucket{Bucket: &provisionerv1.BucketKey{Bucket: b, Key: k}}
	}
	tests := []struct {
		name   string
		module string
		needs  []*provisionerv1.NeedRecord
		bad    []*provisionerv1.MalformedKey
		want   *provisionerv1.ComposeResponse
	}{
		{
			name:  "a placement and a collection with its items",
			needs: []*provisionerv1.NeedRecord{need("web", "port", "http", nil), need("web", "shell", "zsh:normal", nil)},
			want: &provisionerv1.ComposeResponse{Node: "ace", Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{
				{Kind: "port", Name: "http", Owner: "mesh-controller", Location: bucket("mesh-controller_assignments", "ace.web"), Revision: 7},
				{Kind: "shell", Name: "zsh:normal", Owner: "mesh-provisioner", Location: bucket("mesh-provisioner_collect", "ace.shell=3Azsh=3Anormal.*"),
					Collection: "shell:zsh:normal", Revision: 7, Items: []*provisionerv1.CollectedItem{{Contributor: "web", Item: &provisionerv1.CollectItem{Value: "a"}, Revision: 3}}},
			}}}},
		},
		{
			name:  "a bound need provisions its provider",
			needs: []*provisionerv1.NeedRecord{need("web", "bound", "db", &provisionerv1.Need{Provider: "pg"})},
			want: &provisionerv1.ComposeResponse{Node: "ace",
				Plans:      []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{{Kind: "bound", Name: "db", Owner: "pg", Location: bucket("pg_bound", "ace.web.db"), Revision: 7}}}},
				Provisions: []*provisionerv1.Provision{{Provider: "pg", Bucket: "pg_bound", Key: "ace.web.db", Module: "web", Provision: "db", Name: "db"}},
			},
		},
		{
			name:   "a module alone, an unknown kind refused",
			module: "db",
			needs:  []*provisionerv1.NeedRecord{need("db", "nosuch", "x", nil), need("web", "port", "http", nil)},
			want: &provisionerv1.ComposeResponse{Node: "ace", Module: "db", Refusals: []*provisionerv1.Refusal{{
				Key: "ace.db.nosuch.x", Module: "db", Kind: "nosuch", Name: "x",
				Reason: provisionerv1.RefusalReason_REFUSAL_REASON_NO_DOMAIN, Detail: `no registry entry answers kind "nosuch"`,
			}}},
		},
		{
			name: "a malformed need key is refused with its parts",
			bad:  []*provisionerv1.MalformedKey{{Bucket: "mesh-provisioner_needs", Key: "ace.web.port", Reason: "too short"}},
			want: &provisionerv1.ComposeResponse{Node: "ace", Refusals: []*provisionerv1.Refusal{{
				Key: "ace.web.port", Module: "web", Kind: "port",
				Reason: provisionerv1.RefusalReason_REFUSAL_REASON_MALFORMED_NEED, Detail: "too short",
			}}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := compose.Compose(compose.Input{
				Node: "ace", Module: tt.module, Needs: tt.needs, Malformed: tt.bad, Items: items,
				Registry: func(k string) *provisionerv1.RegistryEntry { return entries[k] },
			})
			if diff := cmp.Diff(tt.want, got, protocmp.Transform(), protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")); diff != "" {
				t.Errorf("Compose (-want +got):\n%s", diff)
			}
		})
	}
}

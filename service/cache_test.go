package service_test

import (
	"encoding/json"
	"testing"

	"github.com/google/go-cmp/cmp"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/client"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// An answer is reused while what it read is unchanged, with the revisions
// of the moment it is sent; a change to what it read builds it again.
func TestAnswersAreReusedUntilWhatTheyReadChanges(t *testing.T) {
	t.Parallel()
	m := newMesh(t)
	needs := servicetest.Bucket(t, m.nc, keys.NeedsBucket)
	hits := func() float64 {
		t.Helper()
		var cache map[string]any
		if err := json.Unmarshal(endpointData(t, m.svc)["answer_cache"], &cache); err != nil {
			t.Fatal(err)
		}
		return cache["hits"].(float64)
	}
	ace := &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"}
	first := m.ask(t, ace)
	before := hits()
	again := m.ask(t, ace)
	if hits() != before+1 {
		t.Errorf("asking again: %v hits, want %v", hits(), before+1)
	}
	if diff := cmp.Diff(first, again, protocmp.Transform()); diff != "" {
		t.Errorf("a reused answer differs (-first +again):\n%s", diff)
	}

	// A write to another node: ace's answer is reused, at the new revision.
	rev := put(t, needs, "novox.web.port.admin", nil)
	reused := m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: rev})
	if reused.GetRevision() < rev || len(reused.GetNeeds()) != len(first.GetNeeds()) {
		t.Errorf("after novox's write: revision %d (want >= %d), %d needs (want %d)", reused.GetRevision(), rev, len(reused.GetNeeds()), len(first.GetNeeds()))
	}
	// A write to ace: built again, with the new need.
	rev = put(t, needs, "ace.web.port.admin", nil)
	changed := m.ask(t, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: rev})
	if len(changed.GetNeeds()) != len(first.GetNeeds())+1 {
		t.Errorf("after ace's write: %d needs, want %d", len(changed.GetNeeds()), len(first.GetNeeds())+1)
	}

	// A reused composition says so in its phases.
	client := client.New(m.nc)
	var phases [][]string
	for range 2 {
		out, err := client.Compose(t.Context(), &provisionerv1.ComposeRequest{Node: "novox"})
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, p := range out.GetPhases() {
			names = append(names, p.GetName())
		}
		phases = append(phases, names)
	}
	if diff := cmp.Diff([][]string{{"wait", "read", "resolve", "items"}, {"wait", "reused"}}, phases); diff != "" {
		t.Errorf("phases of a built and a reused composition (-want +got):\n%s", diff)
	}

	// The JSON answer, reused or not, is the binary one.
	for range 2 {
		for _, req := range []proto.Message{
			&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace"},
			&provisionerv1.ComposeRequest{Node: "ace"},
		} {
			body, err := protojson.Marshal(req)
			if err != nil {
				t.Fatal(err)
			}
			subject, want, got := wire.ProvisioningSubject, proto.Message(&provisionerv1.ProvisioningResponse{}), proto.Message(&provisionerv1.ProvisioningResponse{})
			if _, ok := req.(*provisionerv1.ComposeRequest); ok {
				subject, want, got = wire.ComposeSubject, &provisionerv1.ComposeResponse{}, &provisionerv1.ComposeResponse{}
			}
			jsonReply := rawTo(t, m.nc, subject, wire.ContentTypeJSON, body)
			binReply := rawTo(t, m.nc, subject, wire.ContentTypeProtobuf, encode(t, req))
			if err := protojson.Unmarshal(jsonReply.Data, got); err != nil {
				t.Fatalf("JSON answer %s: %v", jsonReply.Data, err)
			}
			if err := proto.Unmarshal(binReply.Data, want); err != nil {
				t.Fatal(err)
			}
			ignore := protocmp.IgnoreFields(&provisionerv1.ComposeResponse{}, "phases")
			if diff := cmp.Diff(want, got, protocmp.Transform(), ignore); diff != "" {
				t.Errorf("JSON and binary answers differ (-binary +JSON):\n%s", diff)
			}
		}
	}
}

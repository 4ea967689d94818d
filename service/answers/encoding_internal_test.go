package answers

import (
	"testing"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
)

// marshalJSON says what protojson says, whether its elements are encoded
// anew or found again, and leaves the message as it was.
func TestMarshalJSONDecodesAsProtojson(t *testing.T) {
	t.Parallel()
	answers := []proto.Message{
		&provisionerv1.ComposeResponse{},
		&provisionerv1.ComposeResponse{Node: "n", Behind: []string{"b"}, Plans: []*provisionerv1.ModulePlan{
			{Module: "web", Items: []*provisionerv1.PlanItem{{Kind: "port", Name: "http", Placeholder: "${port:http}", Revision: 3}}},
			{Module: "db"},
		}, Refusals: []*provisionerv1.Refusal{{Key: "n.x.y.z", Detail: "no \"entry\""}}},
		&provisionerv1.ComposeResponse{Plans: []*provisionerv1.ModulePlan{{Module: "only"}}},
		// Two items sharing one list of collected items, as Compose makes
		// them, then the same plan with another item in that list: a plan
		// found again by a key without the list would answer the first.
		sharedCollected("export A=1"),
		sharedCollected("export A=2"),
	}
	for range 2 {
		for _, want := range answers {
			before := proto.Clone(want)
			data, err := marshalJSON(want)
			if err != nil {
				t.Fatal(err)
			}
			got := want.ProtoReflect().New().Interface()
			if err := protojson.Unmarshal(data, got); err != nil {
				t.Fatalf("%s: %v", data, err)
			}
			if !proto.Equal(got, want) {
				t.Errorf("%s decodes as %v, want %v", data, got, want)
			}
			if !proto.Equal(want, before) {
				t.Errorf("marshalJSON changed the message: %v, was %v", want, before)
			}
		}
	}
}

// sharedCollected is an answer of a plan whose two items read one
// collection, holding one list of its items.
func sharedCollected(value string) *provisionerv1.ComposeResponse {
	items := []*provisionerv1.CollectedItem{
		{Contributor: "web", Item: &provisionerv1.CollectItem{Value: value, Attributes: map[string]string{"version": "1", "shell": "zsh"}}, Revision: 7},
		{Contributor: "api", Item: &provisionerv1.CollectItem{Value: "export B=1"}, Revision: 8},
	}
	return &provisionerv1.ComposeResponse{Node: "n", Plans: []*provisionerv1.ModulePlan{{Module: "web", Items: []*provisionerv1.PlanItem{
		{Kind: "shell", Name: "zsh:normal", Collection: "shell:zsh:normal", Items: items},
		{Kind: "port", Name: "http"},
		{Kind: "shell", Name: "zsh:login", Collection: "shell:zsh:normal", Items: items},
	}}}}
}

// In binary, the body of an answer joined to its tail is the whole answer's
// prefix, so that the cache holds a large answer once; in JSON, where the
// two differ, the body itself.
func TestBodyOfAJoinedAnswer(t *testing.T) {
	t.Parallel()
	for _, enc := range []Encoding{{}, {json: true}} {
		body, tail := []byte(`{"node":"ace"}`), []byte(`{"revisions":{}}`)
		whole := enc.Join(body, tail)
		got := enc.BodyOf(whole, body)
		if string(got) != string(body) {
			t.Errorf("json %v: the body of %q is %q, want %q", enc.json, whole, got, body)
		}
		if shared := &got[0] == &whole[0]; shared == enc.json {
			t.Errorf("json %v: the body shares the whole answer's bytes: %v, want %v", enc.json, shared, !enc.json)
		}
	}
}

// Join leaves the room after data alone, which the cache's or a flight's
// readers of data may share; JoinOwned fills it, so that an answer built
// for one request is not copied again to add its tail.
func TestJoinOwnedFillsTheRoomJoinLeaves(t *testing.T) {
	t.Parallel()
	body, tail := []byte("body"), []byte("tail")
	data := append(make([]byte, 0, len(body)+joinRoom(len(body))), body...)
	enc := Encoding{}
	joined := enc.Join(data, tail)
	if &joined[0] == &data[0] || string(data[:cap(data)][len(body):len(body)+len(tail)]) == "tail" {
		t.Errorf("Join wrote into data's room: %q", data[:cap(data)])
	}
	owned := enc.JoinOwned(data, tail)
	if &owned[0] != &data[0] {
		t.Error("JoinOwned copied data that had room for the tail")
	}
	for _, got := range [][]byte{joined, owned} {
		if string(got) != "bodytail" {
			t.Errorf("joined %q, want %q", got, "bodytail")
		}
	}
	if got := enc.BodyOf(owned, data); string(got) != "body" || cap(got) != len(body) {
		t.Errorf("BodyOf the owned join = %q (cap %d), want %q clipped", got, cap(got), "body")
	}
}

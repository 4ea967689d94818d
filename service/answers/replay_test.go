package answers_test

import (
	"testing"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/service/answers"
	"github.com/novox/mesh-provisioner/wire"
)

// A page_token a replay cannot read is refused with the verbs' 400 and no
// answer; it was once dropped, and the replay panicked filling in the nil
// answer.
func TestReplayRefusesAPageTokenItCannotRead(t *testing.T) {
	t.Parallel()
	replay, err := answers.NewReplay(&provisionerv1.Capture{})
	if err != nil {
		t.Fatal(err)
	}
	for _, token := range []string{"not a token", "AAAA"} {
		out, err := replay.Compose(&provisionerv1.ComposeRequest{Node: "ace", PageToken: token})
		if wire.CodeOf(err) != wire.CodeBadRequest || out != nil {
			t.Errorf("Compose with page_token %q = %v, %v; want no answer and a 400", token, out, err)
		}
		got, err := replay.Provisioning(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, PageToken: token})
		if wire.CodeOf(err) != wire.CodeBadRequest || got != nil {
			t.Errorf("Provisioning with page_token %q = %v, %v; want no answer and a 400", token, got, err)
		}
	}
	// Without a token, an empty capture answers: nothing, at revision 0.
	out, err := replay.Compose(&provisionerv1.ComposeRequest{Node: "ace"})
	if err != nil || out.GetRevisions() == nil {
		t.Errorf("Compose of an empty capture = %v, %v; want an answer with its revisions", out, err)
	}
	got, err := replay.Provisioning(&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS})
	if err != nil || got == nil {
		t.Errorf("Provisioning of an empty capture = %v, %v; want an answer", got, err)
	}
}

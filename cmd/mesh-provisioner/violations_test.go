package main

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/novox/mesh-provisioner/wire"
)

func TestViolationsExplainARefusedRequest(t *testing.T) {
	t.Parallel()
	violation := func(verb, subject string) error {
		return errors.New(`nats: permissions violation: Permissions Violation for ` + verb + ` to "` + subject + `"`)
	}
	tests := []struct {
		name    string
		inbox   string
		seen    []error
		err     error
		want    error // nil: err itself
		wantSay string
	}{
		{"inbox refused, no prefix", "", []error{violation("Subscription", "_INBOX.abc.*")}, context.Canceled, ErrInboxRefused,
			"reply inbox _INBOX.abc.* (nats.go's default, as no --inbox-prefix was given); connect with the identity's context (--context: mesh-provisioner init writes one that names its prefix) or with the --inbox-prefix its permissions grant: _INBOX_MESH.node.<node> for a node, _INBOX_MESH.provider.<module> for a provider, _INBOX_MESH.operator.<name> for an operator"},
		{"inbox refused, wrong prefix", "_INBOX_MESH.node.novox", []error{violation("Subscription", "_INBOX_MESH.node.novox.abc.*")}, context.DeadlineExceeded, ErrInboxRefused,
			"its permissions do not grant --inbox-prefix _INBOX_MESH.node.novox"},
		{"a prefix outside _INBOX", "MINE", []error{violation("Subscription", "MINE.abc.*")}, context.Canceled, ErrInboxRefused, "reply inbox MINE.abc.*"},
		{"the inbox explains before a later publish", "", []error{violation("Publish", "$SRV.STATS.mesh-provisioner"), violation("Subscription", "_INBOX.x")}, context.Canceled, ErrInboxRefused, "_INBOX.x"},
		{"the verb refused", "_INBOX_MESH.node.ace", []error{violation("Publish", wire.ComposeSubject)}, context.Canceled, ErrVerbRefused,
			"request on mesh-provisioner.compose: its permissions do not grant the verb"},
		{"another subject refused", "", []error{violation("Publish", "$SRV.STATS.mesh-provisioner")}, context.Canceled, ErrVerbRefused, "$SRV.STATS.mesh-provisioner"},
		{"the service answered", "", []error{violation("Subscription", "_INBOX.x")}, wire.NewError(wire.CodeBadRequest, "no"), nil, ""},
		{"no violation", "", nil, context.DeadlineExceeded, nil, ""},
		{"a subscription that is not the inbox", "", []error{violation("Subscription", "other.>")}, context.Canceled, nil, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			v := newViolations(tt.inbox)
			for _, err := range tt.seen {
				v.record(err)
			}
			got := v.explain(tt.err)
			if tt.want == nil {
				if got != tt.err { //nolint:errorlint // explain must return the very error it was given
					t.Errorf("explain = %v, want %v itself", got, tt.err)
				}
				return
			}
			if !errors.Is(got, tt.want) || !strings.Contains(got.Error(), tt.wantSay) {
				t.Errorf("explain = %v, want %v saying %q", got, tt.want, tt.wantSay)
			}
		})
	}
}

package service_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/wire"
)

// A refusal names the limit a value or a name broke and what to do, and
// echoes a name of any length cut to its first 64 characters and "…":
// a 70 KB value names the 64 KiB a bucket takes of one value, a name over
// 256 bytes says so, and no sentence echoes a long name whole.
func TestRefusalsNameTheLimitAndCutNames(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	servicetest.Start(t, nc)
	cut := func(s string) string { return s[:64] + "…" }
	long := strings.Repeat("a", 70_000)
	longKey := "ace." + strings.Repeat("k", 70_000)
	// A key within the 256 bytes a name may take, but that no key of
	// the bucket can be: its parser's sentence echoes it cut.
	malformed := "ace.web." + strings.Repeat("x", 200) + ".po:rt"
	big := make([]byte, 70_000)
	tests := []struct {
		name     string
		role     wire.Role
		asker    string
		subject  string
		req      proto.Message
		code     wire.Code
		sentence string
	}{
		{"a value over the bucket's largest", wire.RoleNode, "ace", wire.NodeSubject(wire.PutSubject, "ace"),
			&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: "ace.web.port.http", Value: big}},
			wire.CodeTooLarge, "the value of ace.web.port.http is 70000 bytes, more than the 64 KiB (65536 bytes) mesh-provisioner_needs takes of one value: write a smaller one, or have the operator raise it (serve --max-value-size)"},
		{"an applied value over the bucket's largest", wire.RoleNode, "ace", wire.NodeSubject(wire.PutSubject, "ace"),
			&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_APPLIED, Key: "ace.web", Value: big}},
			wire.CodeTooLarge, "the value of ace.web is 70000 bytes, more than the 64 KiB (65536 bytes) mesh-provisioner_applied takes of one value: write a smaller one, or have the operator raise it (serve --max-value-size)"},
		{"a bound value over a provider's largest", wire.RoleProvider, "pg", wire.BindSubject + ".pg",
			&provisionerv1.BindRequest{Key: "ace.web.db", Value: big},
			wire.CodeTooLarge, "the value of ace.web.db is 70000 bytes, more than the 64 KiB (65536 bytes) a provider binds of one value: bind a smaller one"},
		{"an apply's module over 256 bytes", wire.RoleNode, "ace", wire.NodeSubject(wire.ApplySubject, "ace"),
			&provisionerv1.ApplyRequest{Module: long},
			wire.CodeBadRequest, `module "` + cut(long) + `" is 70000 bytes, more than the 256 a name may take: shorten it`},
		{"a put's key over 256 bytes", wire.RoleNode, "ace", wire.NodeSubject(wire.PutSubject, "ace"),
			&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: longKey}},
			wire.CodeBadRequest, `key "` + cut(longKey) + `" is 70004 bytes, more than the 256 a name may take: shorten it`},
		{"a malformed key under 256 bytes", wire.RoleNode, "ace", wire.NodeSubject(wire.PutSubject, "ace"),
			&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: malformed}},
			wire.CodeBadRequest, `key "` + cut(malformed) + `" of mesh-provisioner_needs: malformed key: "` + cut(malformed) + `": token 4 (<name>) holds ':' at byte 2; a token holds only A-Z a-z 0-9 - _ = /`},
		{"a compose's node over 256 bytes", wire.RoleNode, "ace", wire.NodeSubject(wire.ComposeSubject, "ace"),
			&provisionerv1.ComposeRequest{Node: long},
			wire.CodeBadRequest, `node "` + cut(long) + `" is 70000 bytes, more than the 256 a name may take: shorten it`},
		{"a provisioning filter over 256 bytes", wire.RoleNode, "ace", wire.NodeSubject(wire.ProvisioningSubject, "ace"),
			&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: long},
			wire.CodeBadRequest, `filter node "` + cut(long) + `" is 70000 bytes, more than the 256 a name may take: shorten it`},
		{"another node's plan, named at length", wire.RoleNode, "ace", wire.NodeSubject(wire.ComposeSubject, "ace"),
			&provisionerv1.ComposeRequest{Node: long[:200]},
			wire.CodeForbidden, `compose on mesh-provisioner.compose.ace composes node "ace" only, and the request names node "` + cut(long) + `"; ask mesh-provisioner.compose.<node> as that node`},
		{"another node's records, named at length", wire.RoleNode, "ace", wire.NodeSubject(wire.ProvisioningSubject, "ace"),
			&provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: long[:200]},
			wire.CodeForbidden, `WHAT_NEEDS on mesh-provisioner.provisioning.ace: node "ace" reads its own records only, and the request names node "` + cut(long) + `"; ask mesh-provisioner.provisioning.<node> as that node`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			answer := proto.Clone(tt.req) // any message: the call is refused
			err := wire.Call(ctx, nc, tt.role, tt.asker, tt.subject, tt.req, answer)
			werr, ok := err.(*wire.Error) //nolint:errorlint // wire.Call returns the refusal itself
			if !ok {
				t.Fatalf("error %v, want a refusal", err)
			}
			if werr.Code() != tt.code || werr.Sentence() != tt.sentence {
				t.Errorf("refusal %d:\n  %s\nwant %d:\n  %s", werr.Code(), werr.Sentence(), tt.code, tt.sentence)
			}
		})
	}
}

package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/conformance"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/wire"
)

// The join of the Go client, checked with the conformance suite's own data,
// as the TypeScript and Python clients' join tests are: the pages a page
// case expects, served one by one behind page tokens, join to the whole
// answer its unpaged twin expects.

// expected returns a case's expectation: its pages, or its answer.
func expected(t *testing.T, name string) conformance.Expect {
	t.Helper()
	c, err := conformance.LoadFile(filepath.Join("..", "conformance", "cases", name+".json"))
	if err != nil {
		t.Fatal(err)
	}
	return c.Expect
}

// decode reads protobuf JSON into a new message like m.
func decode[M proto.Message](t *testing.T, raw json.RawMessage, m M) M {
	t.Helper()
	if err := protojson.Unmarshal(raw, m); err != nil {
		t.Fatalf("%s: %v", raw, err)
	}
	return m
}

// servePages answers subject with pages, the first to a request without a
// token and each next one to the token of the one before: "page-<i>".
func servePages[Req, Res proto.Message](t *testing.T, nc *nats.Conn, subject string, newReq func() Req, token func(Req) string, setNext func(Res, string), pages []Res) {
	t.Helper()
	sub, err := nc.Subscribe(subject, func(msg *nats.Msg) {
		req := newReq()
		if err := proto.Unmarshal(msg.Data, req); err != nil {
			t.Errorf("a request that does not decode: %v", err)
			return
		}
		i := 0
		if tok := token(req); tok != "" {
			n, err := strconv.Atoi(strings.TrimPrefix(tok, "page-"))
			if err != nil || n <= 0 || n >= len(pages) {
				t.Errorf("a request with the token %q", tok)
				return
			}
			i = n
		}
		page := proto.Clone(pages[i]).(Res)
		reply := nats.NewMsg(msg.Reply)
		reply.Header.Set("Content-Type", wire.ContentTypeProtobuf)
		if i+1 < len(pages) {
			setNext(page, fmt.Sprintf("page-%d", i+1))
		}
		reply.Data, _ = proto.Marshal(page)
		if err := msg.RespondMsg(reply); err != nil {
			t.Error(err)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sub.Unsubscribe() })
}

func TestComposeAllJoinsThePagesToTheWholeComposition(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	for _, tc := range []struct{ paged, whole string }{
		{"page-compose-plan-continues", "compose-node"},
		{"page-compose-module", "compose-module"},
	} {
		t.Run(tc.paged, func(t *testing.T) {
			t.Parallel()
			var pages []*provisionerv1.ComposeResponse
			for _, raw := range expected(t, tc.paged).Pages {
				pages = append(pages, decode(t, raw, &provisionerv1.ComposeResponse{}))
			}
			if len(pages) < 2 {
				t.Fatalf("%s has %d pages: it checks no join", tc.paged, len(pages))
			}
			subject := "test.compose." + tc.paged
			servePages(t, nc, subject, func() *provisionerv1.ComposeRequest { return &provisionerv1.ComposeRequest{} },
				(*provisionerv1.ComposeRequest).GetPageToken,
				func(r *provisionerv1.ComposeResponse, tok string) { r.NextPageToken = tok }, pages)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			got, err := client.New(nc, client.WithSubjects("test.unused", subject)).ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: "ace"})
			if err != nil {
				t.Fatal(err)
			}
			want := decode(t, expected(t, tc.whole).Answer, &provisionerv1.ComposeResponse{})
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("%s joined, against %s (-want +got):\n%s", tc.paged, tc.whole, diff)
			}
		})
	}
}

func TestProvisioningAllJoinsThePagesToTheWholeAnswer(t *testing.T) {
	t.Parallel()
	nc := natstest.Connect(t, natstest.Start(t))
	for _, tc := range []struct{ paged, whole string }{
		{"page-needs-records-and-malformed", "needs-all"},
		{"page-registry", "registry-empty-request"},
		{"page-applied-exact-multiple", "applied-all"},
	} {
		t.Run(tc.paged, func(t *testing.T) {
			t.Parallel()
			var pages []*provisionerv1.ProvisioningResponse
			for _, raw := range expected(t, tc.paged).Pages {
				pages = append(pages, decode(t, raw, &provisionerv1.ProvisioningResponse{}))
			}
			if len(pages) < 2 {
				t.Fatalf("%s has %d pages: it checks no join", tc.paged, len(pages))
			}
			subject := "test.provisioning." + tc.paged
			servePages(t, nc, subject, func() *provisionerv1.ProvisioningRequest { return &provisionerv1.ProvisioningRequest{} },
				(*provisionerv1.ProvisioningRequest).GetPageToken,
				func(r *provisionerv1.ProvisioningResponse, tok string) { r.NextPageToken = tok }, pages)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			got, err := client.New(nc, client.WithSubjects(subject, "test.unused")).ProvisioningAll(ctx, &provisionerv1.ProvisioningRequest{})
			if err != nil {
				t.Fatal(err)
			}
			want := decode(t, expected(t, tc.whole).Answer, &provisionerv1.ProvisioningResponse{})
			if diff := cmp.Diff(want, got, protocmp.Transform()); diff != "" {
				t.Errorf("%s joined, against %s (-want +got):\n%s", tc.paged, tc.whole, diff)
			}
		})
	}
}

// Every list of records a provisioning page holds is joined: a list added
// to the answer and forgotten here (as the manifests once were) fails.
func TestJoinProvisioningPagesKeepsEveryList(t *testing.T) {
	t.Parallel()
	page := &provisionerv1.ProvisioningResponse{}
	fields := page.ProtoReflect().Descriptor().Fields()
	var lists []protoreflect.FieldDescriptor
	for i := range fields.Len() {
		if fd := fields.Get(i); fd.IsList() && fd.Message() != nil {
			lists = append(lists, fd)
			list := page.ProtoReflect().Mutable(fd).List()
			list.Append(list.NewElement())
		}
	}
	whole := client.JoinProvisioningPages([]*provisionerv1.ProvisioningResponse{page, page})
	for _, fd := range lists {
		if n := whole.ProtoReflect().Get(fd).List().Len(); n != 2 {
			t.Errorf("%s: %d records joined from two pages of one each, want 2", fd.Name(), n)
		}
	}
}

package conformance_test

// The Go runner of the conformance suite: every case of conformance/cases
// against the real binary, each on a fresh server. MESH_PROVISIONER_BIN names
// the binary; without it the test builds one. CONFORMANCE_RECORD=DIR writes
// each case's actual answers (binary request) to DIR/<name>.json, to help
// write a new case's expectation, which must then be checked by hand.
// CONFORMANCE_RUN_PENDING=1 runs the cases marked pending too.

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/testing/protocmp"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/testkit/conformance"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

const casesDir = "../../../conformance/cases"

var serverBin string

func TestMain(m *testing.M) {
	serverBin = os.Getenv("MESH_PROVISIONER_BIN")
	if serverBin == "" {
		dir, err := os.MkdirTemp("", "mesh-provisioner-conformance-")
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		serverBin = filepath.Join(dir, "mesh-provisioner")
		build := exec.Command("go", "build", "-o", serverBin, "github.com/novox/mesh-provisioner/cmd/mesh-provisioner")
		build.Stdout, build.Stderr = os.Stderr, os.Stderr
		if err := build.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build mesh-provisioner:", err)
			os.Exit(1)
		}
		code := m.Run()
		_ = os.RemoveAll(dir)
		os.Exit(code)
	}
	os.Exit(m.Run())
}

func TestConformance(t *testing.T) {
	cases, err := conformance.Load(casesDir)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range cases {
		t.Run(c.Name, func(t *testing.T) {
			if c.Pending != "" && os.Getenv("CONFORMANCE_RUN_PENDING") == "" {
				t.Skipf("pending: %s", c.Pending)
			}
			t.Parallel()
			runCase(t, c)
		})
	}
}

func runCase(t *testing.T, c conformance.Case) {
	url := serve(t, c.ServerArgs...)
	nc, err := nats.Connect(url, nats.Name("mesh-provisioner conformance "+c.Name))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := conformance.Apply(ctx, nc, c); err != nil {
		t.Fatal(err)
	}
	asker := nc
	if role, name := c.Asker(); name != "" {
		// The service answers a request on an identity's own subject only
		// on that identity's inbox.
		if asker, err = nats.Connect(url, nats.Name("mesh-provisioner conformance "+c.Name+" as "+name), nats.CustomInboxPrefix(wire.InboxPrefix(role, name))); err != nil {
			t.Fatal(err)
		}
		defer asker.Close()
	}
	if c.Body != nil {
		t.Run("raw", func(t *testing.T) { runRaw(t, asker, c) })
	} else {
		for _, encoding := range []string{"binary", "json"} {
			t.Run(encoding, func(t *testing.T) { runRequest(t, asker, c, encoding) })
		}
	}
	t.Run("stats", func(t *testing.T) { checkStats(t, nc) })
}

// checkStats asks $SRV.STATS.mesh-provisioner and decodes every endpoint's
// data as an EndpointStatsData, refusing fields the message does not know.
func checkStats(t *testing.T, nc *nats.Conn) {
	subject, err := micro.ControlSubject(micro.StatsVerb, "mesh-provisioner", "")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := nc.Request(subject, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats micro.Stats
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatalf("stats %s: %v", msg.Data, err)
	}
	if stats.Type != micro.StatsResponseType || len(stats.Endpoints) == 0 {
		t.Fatalf("stats of type %q with %d endpoints: %s", stats.Type, len(stats.Endpoints), msg.Data)
	}
	for _, e := range stats.Endpoints {
		data := &provisionerv1.EndpointStatsData{}
		if err := (protojson.UnmarshalOptions{DiscardUnknown: false}).Unmarshal(e.Data, data); err != nil {
			t.Errorf("endpoint %s: data is not a %s: %v\n%s", e.Name, data.ProtoReflect().Descriptor().FullName(), err, e.Data)
			continue
		}
		if len(data.GetBuckets()) != len(keys.Buckets()) || data.GetAnswerCache() == nil {
			t.Errorf("endpoint %s: data has %d buckets and answer cache %v, want %d and one", e.Name, len(data.GetBuckets()), data.GetAnswerCache(), len(keys.Buckets()))
		}
	}
}

// serve starts the binary on a fresh state directory and returns its NATS
// URL once it logs that it serves; the server is stopped when the test ends.
func serve(t *testing.T, extra ...string) string {
	t.Helper()
	args := append(append([]string{"--state-dir", t.TempDir()}, conformance.ServeArgs...), extra...)
	cmd := exec.Command(serverBin, args...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	urls := make(chan string, 1)
	var log []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		lines := bufio.NewScanner(stderr)
		for lines.Scan() {
			log = append(log, lines.Text())
			var record struct {
				Msg     string `json:"msg"`
				NatsURL string `json:"nats_url"`
			}
			if json.Unmarshal(lines.Bytes(), &record) == nil && record.Msg == "serving" {
				urls <- record.NatsURL
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		<-done // the log whole
		if t.Failed() {
			t.Logf("the server's log:\n%s", strings.Join(log, "\n"))
		}
	})
	select {
	case url := <-urls:
		return url
	case <-done:
		t.Fatalf("the server exited before serving:\n%s", strings.Join(log, "\n"))
	case <-time.After(20 * time.Second):
		t.Fatal("the server did not serve within 20s")
	}
	return ""
}

// messages returns new request and answer messages of a verb.
func messages(t *testing.T, verb string) (request, answer proto.Message) {
	t.Helper()
	switch verb {
	case "provisioning":
		return &provisionerv1.ProvisioningRequest{}, &provisionerv1.ProvisioningResponse{}
	case "compose":
		return &provisionerv1.ComposeRequest{}, &provisionerv1.ComposeResponse{}
	case "provisions":
		return &provisionerv1.ProvisionsRequest{}, &provisionerv1.ProvisionsResponse{}
	case "put":
		return &provisionerv1.PutRequest{}, &provisionerv1.WriteResponse{}
	case "delete":
		return &provisionerv1.DeleteRequest{}, &provisionerv1.WriteResponse{}
	case "apply":
		return &provisionerv1.ApplyRequest{}, &provisionerv1.ApplyResponse{}
	case "declare":
		return &provisionerv1.DeclareRequest{}, &provisionerv1.WriteResponse{}
	case "bind":
		return &provisionerv1.BindRequest{}, &provisionerv1.WriteResponse{}
	}
	t.Fatalf("verb %q is none of provisioning, compose, provisions, put, delete, apply, declare, bind", verb)
	return nil, nil
}

// reply is what a request got: an answer, or a refusal's code and sentence.
type reply struct {
	answer      proto.Message
	contentType string
	code        int
	sentence    string
}

func ask(t *testing.T, nc *nats.Conn, c conformance.Case, body []byte, contentType string) reply {
	t.Helper()
	verb := c.Verb
	msg := nats.NewMsg(c.Subject())
	msg.Data = body
	if contentType != "" {
		msg.Header.Set("Content-Type", contentType)
	}
	got, err := nc.RequestMsg(msg, 10*time.Second)
	if err != nil {
		t.Fatalf("request %s: %v", verb, err)
	}
	r := reply{contentType: got.Header.Get("Content-Type")}
	if code := got.Header.Get(micro.ErrorCodeHeader); code != "" || got.Header.Get(micro.ErrorHeader) != "" {
		r.code, _ = strconv.Atoi(code)
		r.sentence = got.Header.Get(micro.ErrorHeader)
		return r
	}
	_, r.answer = messages(t, verb)
	if r.contentType == "application/json" {
		err = protojson.Unmarshal(got.Data, r.answer)
	} else {
		err = proto.Unmarshal(got.Data, r.answer)
	}
	if err != nil {
		t.Fatalf("decode the answer (%s): %v", r.contentType, err)
	}
	return r
}

// encode returns a request in an encoding, and its Content-Type.
func encode(t *testing.T, request proto.Message, encoding string) ([]byte, string) {
	t.Helper()
	if encoding == "json" {
		body, err := protojson.Marshal(request)
		if err != nil {
			t.Fatal(err)
		}
		return body, "application/json"
	}
	body, err := proto.Marshal(request)
	if err != nil {
		t.Fatal(err)
	}
	return body, "application/protobuf"
}

func parseRequest(t *testing.T, verb string, text json.RawMessage, pageToken string) proto.Message {
	t.Helper()
	request, _ := messages(t, verb)
	if len(text) > 0 {
		if err := protojson.Unmarshal(text, request); err != nil {
			t.Fatalf("the case's request: %v", err)
		}
	}
	if pageToken != "" {
		m := request.ProtoReflect()
		m.Set(m.Descriptor().Fields().ByName("page_token"), protoreflect.ValueOfString(pageToken))
	}
	return request
}

func runRequest(t *testing.T, nc *nats.Conn, c conformance.Case, encoding string) {
	request := parseRequest(t, c.Verb, c.Request, "")
	var pages []reply
	for {
		body, contentType := encode(t, request, encoding)
		got := ask(t, nc, c, body, contentType)
		if got.contentType != contentType {
			t.Errorf("answered with Content-Type %q, want %q", got.contentType, contentType)
		}
		pages = append(pages, got)
		token := nextPageToken(got.answer)
		if c.Expect.Pages == nil || token == "" || len(pages) > len(c.Expect.Pages) || c.Then != nil {
			break
		}
		request = parseRequest(t, c.Verb, c.Request, token)
	}
	record(t, c, encoding, pages)
	check(t, c.Verb, c.Expect, pages, c.Then != nil)
	if c.Then != nil {
		token := nextPageToken(pages[0].answer)
		if token == "" {
			t.Fatal("then: the first page has no next_page_token")
		}
		body, contentType := encode(t, parseRequest(t, c.Verb, c.Then.Request, token), encoding)
		check(t, c.Verb, c.Then.Expect, []reply{ask(t, nc, c, body, contentType)}, false)
	}
}

func runRaw(t *testing.T, nc *nats.Conn, c conformance.Case) {
	var body []byte
	switch {
	case c.Body.Text != nil:
		body = []byte(*c.Body.Text)
	case c.Body.Base64 != nil:
		var err error
		if body, err = base64.StdEncoding.DecodeString(*c.Body.Base64); err != nil {
			t.Fatal(err)
		}
	}
	var foreign *nats.Subscription
	if c.Reply != "" {
		// Sent first with a reply that is not the asker's inbox: the
		// service handles requests in order, so by the time the second
		// is answered the first was refused or answered.
		var err error
		if foreign, err = nc.SubscribeSync(c.Reply); err != nil {
			t.Fatal(err)
		}
		msg := nats.NewMsg(c.Subject())
		msg.Reply, msg.Data = c.Reply, body
		if c.Body.ContentType != "" {
			msg.Header.Set("Content-Type", c.Body.ContentType)
		}
		if err := nc.PublishMsg(msg); err != nil {
			t.Fatal(err)
		}
	}
	got := ask(t, nc, c, body, c.Body.ContentType)
	if foreign != nil {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		if n, _, _ := foreign.Pending(); n != 0 {
			t.Errorf("%d messages reached %s, the reply subject that is not the asker's inbox", n, c.Reply)
		}
	}
	if c.Expect.ContentType != "" && got.contentType != c.Expect.ContentType {
		t.Errorf("answered with Content-Type %q, want %q", got.contentType, c.Expect.ContentType)
	}
	record(t, c, "raw", []reply{got})
	check(t, c.Verb, c.Expect, []reply{got}, false)
}

func nextPageToken(answer proto.Message) string {
	if a, ok := answer.(interface{ GetNextPageToken() string }); ok {
		return a.GetNextPageToken()
	}
	return ""
}

// comparable returns the answer without what the suite does not compare: the
// page token (opaque; only whether it is empty counts) and compose's phases
// (timings).
func comparableOf(answer proto.Message) proto.Message {
	answer = proto.Clone(answer)
	m := answer.ProtoReflect()
	for _, name := range []protoreflect.Name{"next_page_token", "phases"} {
		if fd := m.Descriptor().Fields().ByName(name); fd != nil {
			m.Clear(fd)
		}
	}
	return answer
}

// check compares what a request got with what the case expects. more says
// that the last page expected is not the last page there is (a case whose
// "then" continues after it).
func check(t *testing.T, verb string, expect conformance.Expect, got []reply, more bool) {
	t.Helper()
	if e := expect.Error; e != nil {
		r := got[0]
		if r.answer != nil {
			t.Fatalf("answered, want error %d", e.Code)
		}
		if r.code != e.Code {
			t.Errorf("code %d (%s), want %d", r.code, r.sentence, e.Code)
		}
		if e.Sentence != "" && r.sentence != e.Sentence {
			t.Errorf("sentence\n  %s\nwant\n  %s", r.sentence, e.Sentence)
		}
		if e.SentencePrefix != "" && !strings.HasPrefix(r.sentence, e.SentencePrefix) {
			t.Errorf("sentence\n  %s\nwant one starting\n  %s", r.sentence, e.SentencePrefix)
		}
		return
	}
	want := expect.Pages
	if want == nil {
		want = []json.RawMessage{expect.Answer}
	}
	for i, r := range got {
		if r.answer == nil {
			t.Fatalf("page %d: refused with %d: %s", i+1, r.code, r.sentence)
		}
	}
	if len(got) != len(want) {
		t.Fatalf("%d pages, want %d", len(got), len(want))
	}
	for i, r := range got {
		if token := nextPageToken(r.answer); (token == "") != (i == len(want)-1 && !more) {
			t.Errorf("page %d of %d: next_page_token %q", i+1, len(want), token)
		}
		_, expected := messages(t, verb)
		if err := protojson.Unmarshal(want[i], expected); err != nil {
			t.Fatalf("the case's answer %d: %v", i+1, err)
		}
		if diff := cmp.Diff(comparableOf(expected), comparableOf(r.answer), protocmp.Transform()); diff != "" {
			t.Errorf("page %d of %d differs (-want +got):\n%s", i+1, len(want), diff)
		}
	}
}

// record writes what a case got, for CONFORMANCE_RECORD.
func record(t *testing.T, c conformance.Case, encoding string, got []reply) {
	dir := os.Getenv("CONFORMANCE_RECORD")
	if dir == "" || encoding == "json" {
		return
	}
	var out []json.RawMessage
	for _, r := range got {
		if r.answer == nil {
			text, _ := json.Marshal(map[string]any{"error": map[string]any{"code": r.code, "sentence": r.sentence}})
			out = append(out, text)
			continue
		}
		text, err := protojson.Marshal(comparableOf(r.answer))
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, text)
	}
	text, _ := json.Marshal(out)
	if err := os.WriteFile(filepath.Join(dir, c.Name+".json"), text, 0o644); err != nil {
		t.Fatal(err)
	}
}

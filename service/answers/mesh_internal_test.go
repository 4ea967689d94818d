package answers

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
	"github.com/novox/mesh-provisioner/internal/observe/ratelog"
	"github.com/novox/mesh-provisioner/internal/synth"
	"github.com/novox/mesh-provisioner/internal/testkit/meshtest"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
)

// startOnMesh writes a synthetic mesh into an embedded server's buckets,
// with the registry's table, and returns the answers of a copy that
// follows them, loaded: the answers room alone, as the service holds it,
// its Config changed by options.
func startOnMesh(t testing.TB, meshConfig synth.Config, options ...func(*Config)) (*Answers, *synth.Mesh, *nats.Conn) {
	t.Helper()
	ctx := context.Background()
	nc := natstest.Connect(t, natstest.Start(t))
	mesh := meshtest.Write(t, nc, meshConfig)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	logger := slog.New(slog.DiscardHandler)
	m := mirror.New()
	followers, err := m.Open(ctx, js, logger)
	if err != nil {
		t.Fatal(err)
	}
	running, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); followers.Run(running) }()
	t.Cleanup(func() { stop(); <-done })
	loaded, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, c := range m.Copies() {
		select {
		case <-c.Loaded():
		case <-loaded.Done():
			t.Fatalf("the copy did not load within a minute: %v", m.Loading())
		}
	}
	cfg := Config{
		Copy: m, Followers: followers, Stopping: running, MaxPayload: nc.MaxPayload,
		RevisionWait: 5 * time.Second, SlowCompose: 100 * time.Millisecond, CacheMaxBytes: 64 << 20,
		Logger: logger, Warnings: ratelog.New(logger, ratelog.Period),
	}
	for _, option := range options {
		option(&cfg)
	}
	return New(cfg), mesh, nc
}

// bucketsOn returns what binds a bucket on nc, failing t if it cannot.
func bucketsOn(t *testing.T, nc *nats.Conn) func(bucket string) jetstream.KeyValue {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return func(bucket string) jetstream.KeyValue {
		t.Helper()
		b, err := js.KeyValue(t.Context(), bucket)
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
}

// askCompose asks node's whole composition of s as the compose verb answers
// a request, in JSON or binary: its revisions waited for (the providers'
// buckets its needs name read first), then built, or reused, from the copy.
func askCompose(s *Answers, node string, asJSON bool) (*provisionerv1.ComposeResponse, error) {
	verb := s.Compose()
	in := &provisionerv1.ComposeRequest{Node: node}
	if werr := verb.Check(in); werr != nil {
		return nil, werr
	}
	if werr := s.WaitRevisions(verb.Pending(in)); werr != nil {
		return nil, werr
	}
	data, _, werr := verb.Respond(s, in, Encoding{json: asJSON}, 0)
	if werr != nil {
		return nil, werr
	}
	got := &provisionerv1.ComposeResponse{}
	if asJSON {
		return got, protojson.Unmarshal(data, got)
	}
	return got, proto.Unmarshal(data, got)
}

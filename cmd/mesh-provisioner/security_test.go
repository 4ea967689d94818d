package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/sync/errgroup"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/instance"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/registry"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// printed returns what `mesh-provisioner permissions ARGS...` prints.
func printed(t *testing.T, args ...string) string {
	t.Helper()
	var out, errOut bytes.Buffer
	if err := run(context.Background(), append([]string{"permissions"}, args...), &out, &errOut); err != nil {
		t.Fatalf("permissions %v: %v\n%s", args, err, errOut.String())
	}
	return out.String()
}

// identity is a connection of one user, with the permission violations the
// server reported to it.
type identity struct {
	name string
	nc   *nats.Conn
	js   jetstream.JetStream

	mu         sync.Mutex
	violations []string
	// more is closed, and made again, when a violation is reported.
	more chan struct{}
}

func connectAs(t *testing.T, s *server.Server, role wire.Role, name string) *identity {
	t.Helper()
	id := &identity{name: name, more: make(chan struct{})}
	inbox := wire.InboxPrefix(role, name)
	if role == "" {
		inbox = "_INBOX" // nats.go's default, which no generated set grants
	}
	id.nc = natstest.Connect(t, s,
		nats.UserInfo(name, name+"-secret"),
		nats.CustomInboxPrefix(inbox),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			if errors.Is(err, nats.ErrPermissionViolation) {
				id.mu.Lock()
				id.violations = append(id.violations, err.Error())
				close(id.more)
				id.more = make(chan struct{})
				id.mu.Unlock()
			}
		}))
	var err error
	if id.js, err = jetstream.New(id.nc); err != nil {
		t.Fatal(err)
	}
	return id
}

// violated waits for the server to report a publish to subject as a
// permission violation of this identity.
func (id *identity) violated(subject string) bool { return id.refused("Publish", subject) }

// refused waits for the server to report a "Publish" or "Subscription" to
// subject as a permission violation of this identity.
func (id *identity) refused(verb, subject string) bool {
	want := fmt.Sprintf("Permissions Violation for %s to %q", verb, subject)
	timeout := time.After(3 * time.Second)
	for {
		id.mu.Lock()
		found := slices.ContainsFunc(id.violations, func(v string) bool { return strings.Contains(v, want) })
		more := id.more
		id.mu.Unlock()
		if found {
			return true
		}
		select {
		case <-more:
		case <-timeout:
			return false
		}
	}
}

// snapshot is what must not change when an attempt is refused: every
// stream's configuration and state, and which streams exist.
func snapshot(t *testing.T, admin jetstream.JetStream) map[string]string {
	t.Helper()
	out := map[string]string{}
	names := admin.StreamNames(context.Background())
	for name := range names.Name() {
		s, err := admin.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		info := s.CachedInfo()
		out[name] = fmt.Sprintf("first=%d last=%d msgs=%d rollup=%v deny_delete=%v replicas=%d max_bytes=%d",
			info.State.FirstSeq, info.State.LastSeq, info.State.Msgs, info.Config.AllowRollup, info.Config.DenyDelete, info.Config.Replicas, info.Config.MaxBytes)
	}
	if err := names.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// authorizedServer starts a nats-server whose authorization is exactly what
// the permissions command prints, for users mesh-provisioner and
// mesh-provisioner-writer (the server's two identities), ace, novox (nodes),
// pg (a provider), ops (an operator) and admin (everything); each user's
// password is its name and "-secret".
func authorizedServer(t *testing.T) *server.Server {
	t.Helper()
	return authorizedPartitionedServer(t, 0)
}

// authorizedPartitionedServer is authorizedServer for a mesh of n
// partitions (none below 2): the mappings and the grants that
// permissions --mappings and --partitions print.
func authorizedPartitionedServer(t *testing.T, n int) *server.Server {
	t.Helper()
	partitions := []string{"--partitions", strconv.Itoa(n)}
	mappings := ""
	if n > 1 {
		mappings = printed(t, "--mappings", "--partitions", strconv.Itoa(n))
	}
	return natstest.StartWithConfig(t, mappings+fmt.Sprintf(`
authorization {
  users = [
    { user: "mesh-provisioner", password: "mesh-provisioner-secret", permissions: %s }
    { user: "mesh-provisioner-writer", password: "mesh-provisioner-writer-secret", permissions: %s }
    { user: "ace", password: "ace-secret", permissions: %s }
    { user: "novox", password: "novox-secret", permissions: %s }
    { user: "pg", password: "pg-secret", permissions: %s }
    { user: "ops", password: "ops-secret", permissions: %s }
    { user: "admin", password: "admin-secret" }
  ]
}`, printed(t, "--server"), printed(t, "--server-writer", "--providers", "pg"), printed(t, append([]string{"--node", "ace", "--providers", "pg"}, partitions...)...),
		printed(t, append([]string{"--node", "novox"}, partitions...)...), printed(t, append([]string{"--provider", "pg", "--json"}, partitions...)...), printed(t, "--operator", "ops", "--providers", "pg")))
}

// serveAuthorized starts the service on s as the server's two identities,
// the buckets created and the registry written, and returns once it is
// ready.
func serveAuthorized(t *testing.T, s *server.Server) {
	t.Helper()
	srv := connectAs(t, s, wire.RoleServer, wire.ServerIdentity)
	writer := connectAs(t, s, wire.RoleServer, wire.WriterIdentity)
	// The 5 MB answer of TestANodeOnARealServer is one node's: more than
	// its default budget.
	servicetest.StartAs(t, srv.nc, writer.nc, func(c *service.Config) { c.NodeMaxBytes = 16 << 20 })
}

// provisioner is the server's two identities on a real server, serving as
// serve does through one instance, which contends for the seat (making the
// buckets, reconciling the registry, writing plans) until stopSeat: it then
// hands the seat back, so that the streams hold still, and answers on as a
// standby.
type provisioner struct {
	srv, answering *identity // the writing identity, and the answering one
	registryKV     jetstream.KeyValue
	inst           *instance.Instance
	stopSeat       func()
}

// startProvisioner starts the server's instance on s as its two identities,
// contending for the seat, and returns once it serves: its copy loaded, and
// holding the registry it wrote. options change the service's Config.
func startProvisioner(ctx context.Context, t *testing.T, s *server.Server, options ...func(*service.Config)) *provisioner {
	t.Helper()
	p := &provisioner{srv: connectAs(t, s, wire.RoleServer, wire.WriterIdentity), answering: connectAs(t, s, wire.RoleServer, wire.ServerIdentity)}
	cfg := service.Config{Conn: p.answering.nc, WatchConn: p.srv.nc, Version: "1.2.3", Logger: slog.New(slog.DiscardHandler)}
	for _, option := range options {
		option(&cfg)
	}
	var err error
	p.inst, err = instance.Start(ctx, instance.Config{Service: cfg})
	if err != nil {
		t.Fatalf("the server's identities start an instance: %v (violations: writer %v, answering %v)", err, p.srv.violations, p.answering.violations)
	}
	t.Cleanup(p.inst.Stop)
	if p.registryKV, err = p.srv.js.KeyValue(ctx, keys.RegistryBucket); err != nil {
		t.Fatal(err)
	}
	contending, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan error, 1)
	go func() { done <- p.inst.Contend(contending) }()
	var once sync.Once
	p.stopSeat = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("the server identity's seat: %v", err)
			}
		})
	}
	t.Cleanup(p.stopSeat) // before the instance stops
	select {
	case <-p.inst.Serving():
	case <-ctx.Done():
		t.Fatalf("the instance does not serve: %v (violations: writer %v, answering %v)", ctx.Err(), p.srv.violations, p.answering.violations)
	}
	return p
}

func TestPermissionsOnARealServer(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	t.Cleanup(cancel)

	// The server's identity creates the buckets, reconciles the registry
	// and serves.
	p := startProvisioner(ctx, t, s)
	srv := p.srv
	natstest.CheckFor(t, 5*time.Second, func() error {
		// The stream holds the table's entries and the seat's lease.
		st, _ := p.registryKV.Status(ctx)
		if held, _ := p.inst.Seat().Held(); !held || st == nil || st.Values() != uint64(len(registry.Table())+1) {
			srv.mu.Lock()
			defer srv.mu.Unlock()
			return fmt.Errorf("server identity takes the seat and reconciles the registry (violations %v)", srv.violations)
		}
		return nil
	})
	// It hands the seat back, so that the streams hold still for the
	// attempts below, and serves on.
	p.stopSeat()

	admin := connectAs(t, s, "", "admin")
	if _, err := admin.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "pg_bound"}); err != nil {
		t.Fatal(err)
	}

	// Each node writes its own state through the node client.
	var lastNeed uint64
	ace, novox := connectAs(t, s, wire.RoleNode, "ace"), connectAs(t, s, wire.RoleNode, "novox")
	for _, id := range []*identity{ace, novox} {
		nodeClient, err := nodeclient.New(ctx, nodeclient.Config{Conn: id.nc, Node: id.name})
		if err != nil {
			t.Fatalf("%s binds the state buckets: %v", id.name, err)
		}
		for _, write := range []func() (uint64, error){
			func() (uint64, error) {
				return nodeClient.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
			},
			func() (uint64, error) {
				revision, err := nodeClient.PutNeed(ctx, "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "database", Local: "web"})
				lastNeed = max(lastNeed, revision)
				return revision, err
			},
			func() (uint64, error) {
				return nodeClient.PutApplied(ctx, "web", &provisionerv1.Applied{PlanDigest: "sha256:" + id.name})
			},
			func() (uint64, error) {
				return nodeClient.PutCollectItem(ctx, "shell:zsh:normal", "web", &provisionerv1.CollectItem{Value: "export A=1"})
			},
		} {
			if _, err := write(); err != nil {
				t.Fatalf("%s writes its own state: %v", id.name, err)
			}
		}
	}

	// ace reads its writes back through the service's verb, on its own
	// subject: its two needs, its applied record and its collection item.
	for what, want := range map[provisionerv1.What]int{provisionerv1.What_WHAT_NEEDS: 2, provisionerv1.What_WHAT_APPLIED: 1, provisionerv1.What_WHAT_COLLECT: 1} {
		natstest.CheckFor(t, 5*time.Second, func() error {
			answer, err := client.New(ace.nc, client.AsNode("ace")).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: what, Node: "ace"})
			if err != nil {
				t.Fatalf("ace asks the verb: %v", err)
			}
			if got := len(answer.GetNeeds()) + len(answer.GetApplied()) + len(answer.GetCollect()); got != want {
				return fmt.Errorf("%s of ace: %d records, want %d", what, got, want)
			}
			return nil
		})
	}

	// The provider asks what it must provision, across the mesh.
	pg := connectAs(t, s, wire.RoleProvider, "pg")
	provisions, err := client.New(pg.nc).Provisions(ctx, &provisionerv1.ProvisionsRequest{Provider: "pg", MinRevisions: &provisionerv1.Revisions{Needs: lastNeed}})
	if err != nil {
		t.Fatalf("pg asks its provisions: %v (violations %v)", err, pg.violations)
	}
	var provisioned []string
	for _, p := range provisions.GetProvisions() {
		provisioned = append(provisioned, p.GetNode()+" "+p.GetKey())
	}
	if diff := cmp.Diff([]string{"ace ace.web.database.web", "novox novox.web.database.web"}, provisioned); diff != "" {
		t.Errorf("pg's provisions (-want +got):\n%s", diff)
	}
	bind, _ := proto.Marshal(&provisionerv1.BindRequest{Key: "ace.web.db", Value: []byte("bound")})
	if _, err := pg.nc.RequestWithContext(ctx, wire.BindSubject+".pg", bind); err != nil {
		t.Errorf("pg binds a key of its own bucket through the service: %v (violations %v)", err, pg.violations)
	}

	baseline := snapshot(t, admin.js)
	registryEntry, _ := proto.Marshal(&provisionerv1.RegistryEntry{Kind: "port", Owner: "ace"})
	needValue, _ := proto.Marshal(&provisionerv1.Need{Placeholder: "${port:http}"})
	answering := connectAs(t, s, wire.RoleServer, wire.ServerIdentity)
	novoxItem, _ := keys.CollectKey{Node: "novox", Collection: "shell:zsh:normal", Contributor: "web"}.Key()
	request := func(id *identity, subject, body string) func(context.Context) error {
		return func(ctx context.Context) error {
			_, err := id.nc.RequestWithContext(ctx, subject, []byte(body))
			return err
		}
	}
	// publish publishes into a stream's subject as JetStream's clients do,
	// with reply (an inbox of id's when empty): the answer JetStream would
	// send there is what an attacker aims elsewhere.
	publish := func(id *identity, subject, reply string, data []byte, header ...string) func(context.Context) error {
		return func(ctx context.Context) error {
			msg := nats.NewMsg(subject)
			msg.Data = data
			for i := 0; i+1 < len(header); i += 2 {
				msg.Header.Set(header[i], header[i+1])
			}
			if reply == "" {
				_, err := id.nc.RequestMsgWithContext(ctx, msg)
				return err
			}
			msg.Reply = reply
			if err := id.nc.PublishMsg(msg); err != nil {
				return err
			}
			_ = id.nc.FlushWithContext(ctx)
			<-ctx.Done()
			return ctx.Err()
		}
	}
	// write asks a write verb as id with a PutRequest of key and value,
	// its reply on id's own inbox unless reply is given.
	write := func(id *identity, key string, value []byte, reply string) func(context.Context) error {
		body, _ := proto.Marshal(&provisionerv1.PutRequest{Record: &provisionerv1.Record{What: provisionerv1.What_WHAT_NEEDS, Key: key, Value: value}})
		if reply != "" {
			return publish(id, wire.NodeSubject(wire.PutSubject, id.name), reply, body)
		}
		return func(ctx context.Context) error {
			msg, err := id.nc.RequestWithContext(ctx, wire.NodeSubject(wire.PutSubject, id.name), body)
			if err != nil {
				return err
			}
			return wire.ErrorOf(msg)
		}
	}
	stream := func(bucket string) string { return wire.StreamOf(bucket) }
	plan := func(node string) string { return wire.KVSubject(keys.PlansBucket, node) }
	directPlan := "$JS.API.DIRECT.GET." + stream(keys.PlansBucket) + "." + plan("ace")

	type outcome int
	const (
		permissionViolation outcome = iota // the server refuses the publish
		notAnswered                        // the service neither stores nor answers it
		badRequest                         // the service refuses it: 400
		forbidden                          // 403
		tooLarge                           // 413
	)
	type attempt struct {
		who     *identity
		action  string
		attempt func(context.Context) error
		want    outcome
		subject string // of the violation
	}
	tests := []attempt{
		// Into JetStream directly: every node's and provider's publish there
		// is refused, whatever its reply subject would have made of the
		// answer (issue 36's attacks, one by one).
		{ace, "put its own need with the PubAck aimed at novox's need", publish(ace, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"), wire.KVSubject(keys.NeedsBucket, "novox.web.port.evil"), needValue),
			permissionViolation, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http")},
		{ace, "put its own need with the PubAck aimed at a registry key", publish(ace, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"), wire.KVSubject(keys.RegistryBucket, "port"), needValue),
			permissionViolation, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http")},
		{ace, "put its own manifest with the PubAck aimed at novox's manifests", publish(ace, wire.KVSubject(keys.ManifestsBucket, "ace.pg"), wire.KVSubject(keys.ManifestsBucket, "novox.pg"), nil),
			permissionViolation, wire.KVSubject(keys.ManifestsBucket, "ace.pg")},
		{ace, "get its own plan with the answer aimed at novox's plan", publish(ace, directPlan, plan("novox"), nil),
			permissionViolation, directPlan},
		{ace, "list the needs' keys through STREAM.INFO's subjects_filter", request(ace, "$JS.API.STREAM.INFO."+stream(keys.NeedsBucket), `{"subjects_filter":">"}`),
			permissionViolation, "$JS.API.STREAM.INFO." + stream(keys.NeedsBucket)},
		{ace, "probe novox's key with Nats-Expected-Last-Subject-Sequence-Subject", publish(ace, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"), "", needValue,
			"Nats-Expected-Last-Subject-Sequence", "0", "Nats-Expected-Last-Subject-Sequence-Subject", wire.KVSubject(keys.NeedsBucket, "novox.web.port.http")),
			permissionViolation, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http")},
		{ace, "declare the manifest of a provider its grant does not name", request(ace, wire.DeclareSubjectOf("ace", "postgres"), ""),
			permissionViolation, wire.DeclareSubjectOf("ace", "postgres")},
		{ace, "declare pg's manifest as novox", request(ace, wire.DeclareSubjectOf("novox", "pg"), ""),
			permissionViolation, wire.DeclareSubjectOf("novox", "pg")},
		{pg, "bind with the PubAck aimed at novox's need", publish(pg, wire.KVSubject("pg_bound", "x"), wire.KVSubject(keys.NeedsBucket, "novox.web.port.http"), nil),
			permissionViolation, wire.KVSubject("pg_bound", "x")},
		{pg, "bind with the PubAck aimed at the seat", publish(pg, wire.KVSubject("pg_bound", "x"), wire.SeatSubject, nil),
			permissionViolation, wire.KVSubject("pg_bound", "x")},
		{pg, "bind as another provider", request(pg, wire.BindSubject+".redis", ""),
			permissionViolation, wire.BindSubject + ".redis"},
		{ace, "put novox's need", publish(ace, wire.KVSubject(keys.NeedsBucket, "novox.web.port.http"), "", nil),
			permissionViolation, wire.KVSubject(keys.NeedsBucket, "novox.web.port.http")},
		{ace, "put novox's collection item", publish(ace, wire.KVSubject(keys.CollectBucket, novoxItem), "", nil),
			permissionViolation, wire.KVSubject(keys.CollectBucket, novoxItem)},
		{ace, "put a registry entry", publish(ace, wire.KVSubject(keys.RegistryBucket, "port"), "", registryEntry),
			permissionViolation, wire.KVSubject(keys.RegistryBucket, "port")},
		{ace, "take the provisioner seat", publish(ace, wire.SeatSubject, "", []byte(`{"holder":"ace"}`)),
			permissionViolation, wire.SeatSubject},
		{pg, "take the provisioner seat", publish(pg, wire.SeatSubject, "", []byte(`{"holder":"pg"}`)),
			permissionViolation, wire.SeatSubject},
		{ace, "take a partition's seat", publish(ace, wire.PartitionSeatSubject(0), "", []byte(`{"holder":"ace"}`)),
			permissionViolation, wire.PartitionSeatSubject(0)},
		{pg, "bind with the PubAck aimed at a partition's seat", publish(pg, wire.KVSubject("pg_bound", "x"), wire.PartitionSeatSubject(0), nil),
			permissionViolation, wire.KVSubject("pg_bound", "x")},
		{ace, "roll up the needs on its own key", publish(ace, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"), "", nil, "Nats-Rollup", "all"),
			permissionViolation, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http")},
		{ace, "create a new bucket", func(ctx context.Context) error {
			_, err := ace.js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ace_own"})
			return err
		}, permissionViolation, "$JS.API.INFO"}, // the KV client asks this first
		{ace, "create a new bucket's stream", func(ctx context.Context) error {
			_, err := ace.js.CreateStream(ctx, jetstream.StreamConfig{Name: "KV_ace_own", Subjects: []string{wire.KVSubject("ace_own", ">")}})
			return err
		}, permissionViolation, "$JS.API.STREAM.CREATE.KV_ace_own"},
		{pg, "bind the needs", func(ctx context.Context) error { _, err := pg.js.KeyValue(ctx, keys.NeedsBucket); return err },
			permissionViolation, "$JS.API.STREAM.INFO.KV_mesh-provisioner_needs"},
		{pg, "get a need by key", request(pg, "$JS.API.DIRECT.GET.KV_mesh-provisioner_needs.$KV.mesh-provisioner_needs.ace.web.port.http", ""),
			permissionViolation, "$JS.API.DIRECT.GET.KV_mesh-provisioner_needs.$KV.mesh-provisioner_needs.ace.web.port.http"},
		{pg, "watch the needs", request(pg, "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_needs", "{}"),
			permissionViolation, "$JS.API.CONSUMER.CREATE.KV_mesh-provisioner_needs"},
		{pg, "ask another provider's provisions", request(pg, wire.ProviderSubject("redis"), `{"provider":"redis"}`),
			permissionViolation, wire.ProviderSubject("redis")},
		{pg, "ask a node's plan", request(pg, wire.ComposeSubject, `{"node":"ace"}`),
			permissionViolation, wire.ComposeSubject},
		{answering, "put a need", publish(answering, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http"), "", needValue),
			permissionViolation, wire.KVSubject(keys.NeedsBucket, "ace.web.port.http")},

		// Through the write verbs: the service checks each write before it
		// stores anything.
		{ace, "put novox's need through its own verb", write(ace, "novox.web.port.http", needValue, ""), forbidden, ""},
		{ace, "have its write answered into novox's inbox", write(ace, "ace.web.port.evil", needValue, wire.InboxPrefix(wire.RoleNode, "novox")+".x"), notAnswered, ""},
		{ace, "have its write answered on novox's need", write(ace, "ace.web.port.evil", needValue, wire.KVSubject(keys.NeedsBucket, "novox.web.port.evil")), notAnswered, ""},
		{ace, "put a value over the bucket's largest", write(ace, "ace.web.port.big", make([]byte, 70_000), ""), tooLarge, ""},
		{ace, "put a value that does not decode", write(ace, "ace.web.port.bad", []byte{0xff, 0xff}, ""), badRequest, ""},
		{ace, "put a malformed key", write(ace, "ace.web.port", needValue, ""), badRequest, ""},
	}
	for _, bucket := range keys.Buckets() {
		tests = append(tests,
			attempt{ace, "purge stream " + stream(bucket), request(ace, "$JS.API.STREAM.PURGE."+stream(bucket), "{}"), permissionViolation, "$JS.API.STREAM.PURGE." + stream(bucket)},
			attempt{ace, "delete stream " + stream(bucket), func(ctx context.Context) error { return ace.js.DeleteStream(ctx, stream(bucket)) }, permissionViolation, "$JS.API.STREAM.DELETE." + stream(bucket)},
			attempt{ace, "update stream " + stream(bucket), func(ctx context.Context) error {
				_, err := ace.js.UpdateStream(ctx, jetstream.StreamConfig{Name: stream(bucket), Subjects: []string{wire.KVSubject(bucket, ">")}, AllowRollup: true})
				return err
			}, permissionViolation, "$JS.API.STREAM.UPDATE." + stream(bucket)},
			attempt{pg, "purge stream " + stream(bucket), request(pg, "$JS.API.STREAM.PURGE."+stream(bucket), "{}"), permissionViolation, "$JS.API.STREAM.PURGE." + stream(bucket)},
		)
	}
	for _, tt := range tests {
		t.Run(tt.who.name+" may not "+tt.action, func(t *testing.T) {
			t.Parallel()
			// A refused publish is never answered: the attempt ends when
			// ctx does, and the violation is what tells it was refused.
			ctx, cancel := context.WithTimeout(context.Background(), 250*time.Millisecond)
			defer cancel()
			err := tt.attempt(ctx)
			if err == nil {
				t.Fatal("the attempt succeeded")
			}
			switch tt.want {
			case permissionViolation:
				if !tt.who.violated(tt.subject) {
					t.Errorf("no permission violation for %s (the attempt failed with %v)", tt.subject, err)
				}
			case notAnswered:
				if !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, nats.ErrTimeout) {
					t.Errorf("error %v, want no answer", err)
				}
			case badRequest, forbidden, tooLarge:
				if code := wire.CodeOf(err); code != map[outcome]wire.Code{badRequest: wire.CodeBadRequest, forbidden: wire.CodeForbidden, tooLarge: wire.CodeTooLarge}[tt.want] {
					t.Errorf("error %v (code %d), want the service's refusal", err, code)
				}
			}
			if diff := cmp.Diff(baseline, snapshot(t, admin.js)); diff != "" {
				t.Errorf("the streams changed (-before +after):\n%s", diff)
			}
		})
	}
}

func TestSecurityDocMatchesTheCommand(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	squeeze := func(s string) string { return strings.Join(strings.Fields(s), "") }
	for _, args := range [][]string{{"--server"}, {"--server-writer", "--providers", "pg"}, {"--node", "ace", "--providers", "pg"}, {"--node", "novox"}, {"--provider", "pg"}, {"--operator", "alice", "--providers", "pg"}} {
		if !strings.Contains(squeeze(string(doc)), squeeze(printed(t, args...))) {
			t.Errorf("docs/security.md does not hold what `permissions %s` prints; regenerate its example", strings.Join(args, " "))
		}
	}

	// The example is a configuration nats-server loads.
	_, config, ok := strings.Cut(string(doc), "```\n# nats-server.conf\n")
	config, _, _ = strings.Cut(config, "```")
	if !ok || config == "" {
		t.Fatal("docs/security.md has no nats-server.conf example")
	}
	// nats-server reads $X from the environment; stand in for it here.
	config = regexp.MustCompile(`\$[A-Z_]+_PASSWORD`).ReplaceAllString(config, `"secret"`)
	file := filepath.Join(t.TempDir(), "nats-server.conf")
	if err := os.WriteFile(file, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(file)
	if err != nil {
		t.Fatalf("the example does not load: %v", err)
	}
	if len(opts.Users) != 6 {
		t.Errorf("the example has %d users, want 6", len(opts.Users))
	}
}

//nolint:tparallel // the steps share one node's connection and keys.
func TestANodeOnARealServer(t *testing.T) {
	t.Parallel()
	s := authorizedServer(t)
	serveAuthorized(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	ace := connectAs(t, s, wire.RoleNode, "ace")
	aceURL := "nats://ace:ace-secret@" + strings.TrimPrefix(s.ClientURL(), "nats://")

	t.Run("composes its own plan", func(t *testing.T) {
		nodeClient, err := nodeclient.New(ctx, nodeclient.Config{Conn: ace.nc, Node: "ace"})
		if err != nil {
			t.Fatal(err)
		}
		revision, err := nodeClient.PutNeed(ctx, "web", "port", "http", &provisionerv1.Need{Placeholder: "${port:http}"})
		if err != nil {
			t.Fatal(err)
		}
		plan, err := client.New(ace.nc, client.AsNode("ace")).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Needs: revision}})
		if err != nil {
			t.Fatalf("ace composes its plan: %v (violations %v)", err, ace.violations)
		}
		if len(plan.GetPlans()) != 1 || plan.GetPlans()[0].GetItems()[0].GetOwner() != "mesh-controller" {
			t.Errorf("ace's plan: %v, want web's port:http resolved to mesh-controller", plan)
		}
	})

	t.Run("reads no other identity's inbox", func(t *testing.T) {
		for _, inbox := range []string{
			wire.InboxPrefix(wire.RoleProvider, "pg") + ".>",
			wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity) + ".>",
			wire.InboxPrefix(wire.RoleNode, "novox") + ".>",
			"_INBOX.>",
			"_INBOX_MESH.>",
		} {
			if _, err := ace.nc.SubscribeSync(inbox); err != nil {
				t.Fatal(err)
			}
			if !ace.refused("Subscription", inbox) {
				t.Errorf("ace subscribed to %s with no permission violation", inbox)
			}
		}
	})

	t.Run("query says which inbox prefix to use, at once", func(t *testing.T) {
		tests := []struct {
			name  string
			args  []string
			inbox []string
			says  string
		}{
			// --timeout past the test's 20s: only NATS's refusal can end
			// the command before them (capture has no timeout of its own).
			{"no prefix", []string{"query", "registry", "--timeout", "1m"}, nil, "NATS refused this identity's subscription to its reply inbox _INBOX."},
			{"another node's", []string{"query", "compose", "--node", "ace", "--timeout", "1m"}, []string{"--inbox-prefix", wire.InboxPrefix(wire.RoleNode, "novox")}, "its permissions do not grant --inbox-prefix _INBOX_MESH.node.novox"},
			{"a provider's", []string{"query", "needs", "--timeout", "1m"}, []string{"--inbox-prefix", wire.InboxPrefix(wire.RoleProvider, "ace")}, "its permissions do not grant --inbox-prefix _INBOX_MESH.provider.ace"},
			{"status, no prefix", []string{"status", "--timeout", "1m"}, nil, "NATS refused this identity's subscription to its reply inbox _INBOX."},
			{"capture, no prefix", []string{"capture", "--out", filepath.Join(t.TempDir(), "capture.pb")}, nil, "NATS refused this identity's subscription to its reply inbox _INBOX."},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				t.Parallel()
				start := time.Now()
				// A bound of its own: the test's 30 s is its set-up's and the
				// subtests' before, which a loaded machine can spend.
				ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
				defer cancel()
				err := run(ctx, append(append(tt.args, "--nats-url", aceURL), tt.inbox...), &bytes.Buffer{}, &bytes.Buffer{})
				// No waiting out the 20s for an answer that cannot come: the
				// command fails as soon as NATS refuses, well before them.
				if ctx.Err() != nil {
					t.Errorf("waited out its 20s (%v), want to fail as soon as NATS refuses", err)
				}
				t.Logf("failed after %s", time.Since(start).Round(time.Millisecond))
				if !errors.Is(err, ErrInboxRefused) || !strings.Contains(err.Error(), tt.says) || !strings.Contains(err.Error(), "--context") || !strings.Contains(err.Error(), "_INBOX_MESH.node.<node> for a node") {
					t.Errorf("error %v, want ErrInboxRefused saying %q and naming --context and a node's _INBOX_MESH.node.<node>", err, tt.says)
				}
			})
		}
	})

	t.Run("a 5 MB answer arrives whole through query", func(t *testing.T) {
		// 5,000 puts and a paged answer of 5 MB: a context of its own, which
		// a busy machine's other subtests do not eat into.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		nodeClient, err := nodeclient.New(ctx, nodeclient.Config{Conn: ace.nc, Node: "ace"})
		if err != nil {
			t.Fatal(err)
		}
		// 50 modules of 100 needs, each module's written at once as a
		// node writes many (a put each is past the write rate).
		const modules, needs = 50, 100
		padding := strings.Repeat("x", 1100)
		g, gctx := errgroup.WithContext(ctx)
		g.SetLimit(8)
		revisions := make([]uint64, modules)
		for m := range modules {
			g.Go(func() error {
				set := make([]nodeclient.ModuleNeed, needs)
				for i := range set {
					set[i] = nodeclient.ModuleNeed{Kind: "config", Name: fmt.Sprintf("n%04d", m*needs+i), Need: &provisionerv1.Need{Placeholder: "${config:" + padding + "}"}}
				}
				applied, err := nodeClient.ApplyNeeds(gctx, fmt.Sprintf("m%02d", m), set)
				revisions[m] = applied.GetRevision()
				return err
			})
		}
		if err := g.Wait(); err != nil {
			t.Fatal(err)
		}
		// Once the copy holds every write, query asks for all of it.
		if _, err := client.New(ace.nc, client.AsNode("ace")).Provisioning(ctx, &provisionerv1.ProvisioningRequest{What: provisionerv1.What_WHAT_NEEDS, Node: "ace", MinRevision: slices.Max(revisions), PageSize: 1}); err != nil {
			t.Fatal(err)
		}
		var out bytes.Buffer
		if err := run(ctx, []string{"query", "needs", "--node", "ace", "--json", "--nats-url", aceURL, "--inbox-prefix", wire.InboxPrefix(wire.RoleNode, "ace")}, &out, &bytes.Buffer{}); err != nil {
			t.Fatalf("query needs as ace: %v", err)
		}
		var answer provisionerv1.ProvisioningResponse
		if err := protojson.Unmarshal(out.Bytes(), &answer); err != nil {
			t.Fatal(err)
		}
		if got := len(answer.GetNeeds()); got != modules*needs+1 { // and port:http
			t.Errorf("query answered %d needs, want %d", got, modules*needs+1)
		}
		if size := proto.Size(&answer); size < 5<<20 || int64(size) < 4*ace.nc.MaxPayload() {
			t.Errorf("the answer is %d bytes, want over 5 MB and several times max_payload (%d) so that it took pages", size, ace.nc.MaxPayload())
		}
	})
}

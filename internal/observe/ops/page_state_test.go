package ops_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/observe/meshstatus"
	"github.com/novox/mesh-provisioner/internal/observe/ops"
	"github.com/novox/mesh-provisioner/internal/testkit/natstest"
	"github.com/novox/mesh-provisioner/internal/testkit/servicetest"
	"github.com/novox/mesh-provisioner/internal/testkit/testlog"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/nodeclient"
	"github.com/novox/mesh-provisioner/permissions"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

// page GETs the status page of srv with the tests' token.
func page(t *testing.T, srv *ops.Server) string {
	t.Helper()
	code, _, html := request(t, srv.URL()+"/", "", testToken)
	if code != http.StatusOK {
		t.Fatalf("/: %d\n%s", code, html)
	}
	return html
}

// cellOf returns the text of the cell of class in the page's row that
// carries attr (such as `data-provider="pg"`), and whether there is one.
func cellOf(html, attr, class string) (string, bool) {
	m := regexp.MustCompile(`(?s)<tr ` + regexp.QuoteMeta(attr) + `[^>]*>.*?class="` + regexp.QuoteMeta(class) + `">([^<]*)<`).FindStringSubmatch(html)
	if m == nil {
		return "", false
	}
	return strings.TrimSpace(m[1]), true
}

// TestPageShowsTheWriterErrorsConnectionsAndProviders: a service that holds
// the seat writes the registry and a plan digest, refuses a bad request,
// follows a provider's bucket, and one of its connections is cut and
// reconnects; the page says each as the bucket, the stats and the
// connections have it.
func TestPageShowsTheWriterErrorsConnectionsAndProviders(t *testing.T) {
	t.Parallel()
	ctx := t.Context()
	s := natstest.Start(t)
	// With no authorization, nats-server takes any password: the page must
	// not show it.
	const password = "pAssw0rd-of-the-test"
	withPassword := strings.Replace(s.ClientURL(), "nats://", "nats://svc:"+password+"@", 1)
	connect := func(name string) *nats.Conn {
		nc, err := nats.Connect(withPassword, nats.Name(name), nats.ReconnectWait(10*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	answering, writing, asking := connect("answering"), connect("writing"), connect("asking")
	srv, err := ops.Start(context.WithoutCancel(ctx), ops.Config{Addr: "127.0.0.1:0", Token: []byte(testToken)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	since := time.Now().Add(-time.Minute).UTC().Truncate(time.Second)
	svc := servicetest.StartAs(t, answering, writing, func(c *service.Config) {
		c.Seat = func() (bool, time.Time, string) { return true, since, "SEATID" }
	})
	servicetest.RunPlans(t, svc, writing, 10*time.Millisecond)
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{answering, writing}, Ask: asking, Read: writing})

	// A node that needs pg's database and runs pg; pg binds it.
	ace, err := nodeclient.New(ctx, nodeclient.Config{Conn: asking, Node: "ace"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ace.PutNeed(ctx, "web", "bound", "db", &provisionerv1.Need{Placeholder: "${bound:db}", Provider: "pg", Provision: "db", Local: "ro"}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := ace.PutManifest(ctx, "pg", &provisionerv1.Manifest{Offers: []*provisionerv1.Offer{{Provision: "db"}}}); err != nil {
		t.Fatal(err)
	}
	bound, err := client.New(asking).Bind(ctx, "pg", "ace.web.db.ro", []byte("bound"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.New(asking).Compose(ctx, &provisionerv1.ComposeRequest{Node: "ace", MinRevisions: &provisionerv1.Revisions{Bound: map[string]uint64{wire.BoundBucket("pg"): bound}}}); err != nil {
		t.Fatal(err)
	}
	// A refusal on arrival, and a connection cut.
	if msg, err := asking.Request(wire.ProvisioningSubject, []byte("not protobuf"), 2*time.Second); err != nil || msg.Header.Get("Nats-Service-Error-Code") != "400" {
		t.Fatalf("a bad request: %v %v, want a 400", err, msg)
	}
	kick(t, s, "asking")

	// The registry's last write, as its bucket has it.
	registry := servicetest.Bucket(t, writing, keys.RegistryBucket)
	var last jetstream.KeyValueEntry
	lister, err := registry.ListKeys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for key := range lister.Keys() {
		e, err := registry.Get(ctx, key)
		if err != nil {
			t.Fatal(err)
		}
		if last == nil || e.Revision() > last.Revision() {
			last = e
		}
	}

	var html string
	natstest.CheckFor(t, 10*time.Second, func() error {
		html = page(t, srv)
		for _, want := range []string{
			`data-provider="pg" data-state="following"`,
			`data-conn="asking" data-status="connected"`,
			`class="pending">0<`,
		} {
			if !strings.Contains(html, want) {
				return fmt.Errorf("no %s in the page:\n%s", want, html)
			}
		}
		if got, _ := cellOf(html, `data-conn="asking"`, "reconnects"); got != "1" {
			return fmt.Errorf("asking's reconnections %q, want 1", got)
		}
		return nil
	})

	// The writer: the seat, the registry's last write, the plans writer.
	if want := `id="seat" data-seat="held" data-holder="SEATID"`; !strings.Contains(html, want) {
		t.Errorf("the page does not show the seat held (%s)", want)
	}
	if want := fmt.Sprintf(`id="registry-write" data-revision="%d"`, last.Revision()); !strings.Contains(html, want) {
		t.Errorf("the page does not show the registry's last write at revision %d (%s)", last.Revision(), want)
	}
	if at := last.Created().UTC().Format("2006-01-02 15:04:05"); !strings.Contains(html, "last written at revision "+strconv.FormatUint(last.Revision(), 10)+", "+at+" UTC") {
		t.Errorf("the page does not say the registry was last written at %s", at)
	}
	if !strings.Contains(html, "this instance's copy holds it") {
		t.Error("the page does not say the copy holds the registry's last write")
	}
	// Nothing is pending: the plans writer's counts stand still, as the
	// stats have them.
	plans := meshstatus.InstanceOf(svc.Stats()).Plans
	lastWritten, err := time.Parse(time.RFC3339Nano, plans.GetLastWritten())
	if err != nil {
		t.Fatalf("the stats' plans.last_written %q: %v", plans.GetLastWritten(), err)
	}
	for class, want := range map[string]string{"written": strconv.FormatUint(plans.GetWritten(), 10), "failed": "0",
		"last-written": lastWritten.UTC().Format(time.DateTime)} {
		if got, _ := cellOf(html, `data-plans`, class); got != want || plans.GetWritten() == 0 {
			t.Errorf("the plans writer's %s: the page says %q, the stats %q", class, got, want)
		}
	}

	// The connections: each of serve's, without the password.
	for _, name := range []string{"answering", "writing", "asking"} {
		if got, _ := cellOf(html, `data-conn="`+name+`"`, "status"); got != "connected" {
			t.Errorf("connection %s shows %q, want connected", name, got)
		}
	}
	if in, _ := cellOf(html, `data-conn="writing"`, "in-msgs"); in == "" || in == "0" {
		t.Errorf("the writing connection shows %q messages in, want its watchers' messages", in)
	}
	if strings.Contains(html, password) || !strings.Contains(html, "nats://svc:xxxxx@") {
		t.Error("the page shows a connection's password, or no URL with it redacted")
	}

	// The recent errors: the refusal, with micro's words, and the cut.
	if got, _ := cellOf(html, `data-what="endpoint provisioning"`, "counts"); !strings.HasPrefix(got, "refused on arrival: 1") {
		t.Errorf("the recent errors say %q of provisioning, want refused on arrival: 1", got)
	}
	if got, _ := cellOf(html, `data-what="connection &#34;asking&#34; (the status page)"`, "counts"); got != "reconnections: 1" {
		t.Errorf("the recent errors say %q of the asking connection, want reconnections: 1", got)
	}

	// The providers: pg, whose manifest ace declares and whose bucket the
	// writer follows, one provision bound.
	for class, want := range map[string]string{"declared": "1", "bound": "1", "pending": "0"} {
		if got, _ := cellOf(html, `data-provider="pg"`, class); got != want {
			t.Errorf("provider pg's %s: %q, want %s", class, got, want)
		}
	}
	if !strings.Contains(html, "<td>pg_bound</td>") || !strings.Contains(html, fmt.Sprintf("follows it, up to revision %d", bound)) {
		t.Errorf("the page does not say the writer follows pg_bound up to revision %d", bound)
	}
	if strings.Contains(html, `id="refused"`) || strings.Contains(html, "could not be read") {
		t.Error("the page says it could not read the mesh, on an identity that may")
	}
}

// kick disconnects the client connected under name, as a network fault
// would, and waits until nats.go has reconnected it.
func kick(t *testing.T, s *server.Server, name string) {
	t.Helper()
	connz, err := s.Connz(&server.ConnzOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range connz.Conns {
		if c.Name == name {
			if err := s.DisconnectClientByID(c.Cid); err != nil {
				t.Fatal(err)
			}
			natstest.CheckFor(t, 5*time.Second, func() error {
				connz, err := s.Connz(&server.ConnzOptions{})
				if err != nil {
					return err
				}
				for _, again := range connz.Conns {
					if again.Name == name && again.Cid != c.Cid {
						return nil
					}
				}
				return fmt.Errorf("%s has not reconnected", name)
			})
			return
		}
	}
	t.Fatalf("no client named %s", name)
}

// generatedServer starts a nats-server whose authorization is what
// `mesh-provisioner permissions` prints for the server's two identities and
// operator ops; each password is the user's name and "-secret".
func generatedServer(t *testing.T) *server.Server {
	t.Helper()
	writer, err := permissions.ServerWriter()
	if err != nil {
		t.Fatal(err)
	}
	operator, err := permissions.Operator("ops")
	if err != nil {
		t.Fatal(err)
	}
	return natstest.StartWithConfig(t, fmt.Sprintf(`
authorization {
  users = [
    { user: %q, password: "%[1]s-secret", permissions: %[2]s }
    { user: %q, password: "%[3]s-secret", permissions: %[4]s }
    { user: "ops", password: "ops-secret", permissions: %[5]s }
  ]
}`, wire.ServerIdentity, permissions.Server().Config(), wire.WriterIdentity, writer.Config(), operator.Config()))
}

// connectAs connects to s as user, with inbox prefix.
func connectAs(t *testing.T, s *server.Server, user, inbox string) *nats.Conn {
	t.Helper()
	opts := []nats.Option{nats.Name(user), nats.UserInfo(user, user+"-secret")}
	if inbox != "" {
		opts = append(opts, nats.CustomInboxPrefix(inbox))
	}
	return natstest.Connect(t, s, opts...)
}

// pageUnderTheGeneratedPermissions serves as the server's two identities on
// a server that authorizes them as the generated permissions say, and
// starts the HTTP server, logging to log, the page asking on ask (the
// answering connection when nil).
func pageUnderTheGeneratedPermissions(t *testing.T, log *testlog.Buffer, askAs func(s *server.Server) *nats.Conn) (*ops.Server, *nats.Conn) {
	t.Helper()
	s := generatedServer(t)
	answering := connectAs(t, s, wire.ServerIdentity, wire.InboxPrefix(wire.RoleServer, wire.ServerIdentity))
	writing := connectAs(t, s, wire.WriterIdentity, wire.InboxPrefix(wire.RoleServer, wire.WriterIdentity))
	svc := servicetest.StartAs(t, answering, writing)
	ask := answering
	if askAs != nil {
		ask = askAs(s)
	}
	srv, err := ops.Start(context.WithoutCancel(t.Context()), ops.Config{Addr: "127.0.0.1:0", Token: []byte(testToken),
		Logger: slog.New(slog.NewTextHandler(log, nil)), Timeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Close(context.Background()) })
	srv.Attach(ops.Target{Service: svc, Conns: []*nats.Conn{answering, writing}, Ask: ask, Read: writing, AskAs: "the answering identity"})
	return srv, ask
}

// TestPageSaysPlainlyWhenItsIdentityMayNotRead: under the generated
// permissions, the page asking as the server's answering identity says, at
// once and at every refresh, which identity it reads as, what NATS refused
// and how to give it one; it still shows the writer and the connections,
// asks NATS nothing more after the first refusal, and the log says so in one
// line however often it refreshes.
func TestPageSaysPlainlyWhenItsIdentityMayNotRead(t *testing.T) {
	t.Parallel()
	var log testlog.Buffer
	srv, ask := pageUnderTheGeneratedPermissions(t, &log, nil)
	const refreshes = 10
	var sent uint64
	for i := range refreshes {
		start := time.Now()
		html := page(t, srv)
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("refresh %d took %s: the page waited for answers NATS would not deliver", i, took)
		}
		for _, want := range []string{
			`id="refused"`,
			"This page reads the mesh as the answering identity",
			"user <code>" + wire.ServerIdentity + "</code>",
			"NATS refused it a ",
			"that identity may not read the mesh",
			"<code>mesh-provisioner permissions --operator NAME</code>",
			"<code>--http-creds FILE</code>",
			"<code>--http-inbox-prefix _INBOX_MESH.operator.NAME</code>",
			`id="registry-write"`, `data-conn="` + wire.WriterIdentity + `" data-status="connected"`,
		} {
			if !strings.Contains(html, want) {
				t.Fatalf("refresh %d: no %q in the page:\n%s", i, want, html)
			}
		}
		if strings.Contains(html, `id="instances"`) || strings.Contains(html, "could not be read") {
			t.Fatalf("refresh %d: the page shows the mesh, or an error without saying why:\n%s", i, html)
		}
		if i == 0 {
			sent = ask.Stats().OutMsgs
		}
	}
	if now := ask.Stats().OutMsgs; now != sent {
		t.Errorf("the page sent %d more messages on the refused connection after the refusal, want none", now-sent)
	}
	var said, errs []string
	for line := range strings.SplitSeq(log.String(), "\n") {
		if strings.Contains(line, "may not read the mesh") {
			said = append(said, line)
		}
		if strings.Contains(line, "level=ERROR") {
			errs = append(errs, line)
		}
	}
	if len(said) != 1 || len(errs) != 0 {
		t.Errorf("%d refreshes logged %d lines saying the page may not read and %d errors, want 1 and 0:\n%s", refreshes, len(said), len(errs), log.String())
	}
	for _, want := range []string{"--http-creds", "--http-inbox-prefix _INBOX_MESH.operator.NAME", "permissions --operator NAME", "user=" + wire.ServerIdentity} {
		if len(said) == 1 && !strings.Contains(said[0], want) {
			t.Errorf("the log line does not say %q: %s", want, said[0])
		}
	}
}

// TestPageReadsAsAnOperator: the same mesh, the page asking as operator ops
// with its inbox prefix, shows the mesh and no refusal.
func TestPageReadsAsAnOperator(t *testing.T) {
	t.Parallel()
	var log testlog.Buffer
	srv, _ := pageUnderTheGeneratedPermissions(t, &log, func(s *server.Server) *nats.Conn {
		return connectAs(t, s, "ops", wire.InboxPrefix(wire.RoleOperator, "ops"))
	})
	html := page(t, srv)
	if strings.Contains(html, `id="refused"`) || strings.Contains(html, "could not be read") || !strings.Contains(html, `id="instances"`) {
		t.Errorf("the page, read as an operator, does not show the mesh:\n%s", html)
	}
	if strings.Contains(log.String(), "may not read") {
		t.Errorf("the log says the operator may not read:\n%s", log.String())
	}
}

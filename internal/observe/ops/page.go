package ops

import (
	"cmp"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/kvread"
	"github.com/novox/mesh-provisioner/internal/observe/meshstatus"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/service"
	"github.com/novox/mesh-provisioner/wire"
)

//go:embed page.html.tmpl
var pageFS embed.FS

var pageTemplate = template.Must(template.New("page.html.tmpl").Funcs(template.FuncMap{
	"sortedKeys": func(m map[string]int) []string { return slices.Sorted(maps.Keys(m)) },
	"total": func(m map[string]int) int {
		n := 0
		for _, v := range m {
			n += v
		}
		return n
	},
	"when": func(t time.Time) string {
		if t.IsZero() {
			return "-"
		}
		return t.UTC().Format("2006-01-02 15:04:05")
	},
}).ParseFS(pageFS, "page.html.tmpl"))

// How much the page shows of what may grow without bound.
const (
	// maxEvents is how many recent errors the page keeps.
	maxEvents = 20
	// maxProviders is how many providers it lists: a node may name any.
	maxProviders = 50
)

// pageData is what the status page shows.
type pageData struct {
	Service  string
	Now      time.Time
	Refresh  int // seconds
	Ready    bool
	NotReady []string
	// This instance, from its own stats; empty before it serves.
	ID, Version string
	Seat        string // held, standby or empty
	SeatSince   string
	SeatHolder  string
	// Writer is the registry's last write and the plans writer; nil before
	// the instance serves.
	Writer *writerView
	// Errors are the recent errors, the newest first, counted since
	// ErrorsSince (the instance's start).
	Errors      []event
	ErrorsSince time.Time
	// Conns are serve's connections to NATS.
	Conns []connView
	// Providers are the providers the copy knows; nil before it serves.
	Providers *providersView
	// Refused says NATS refused the page's identity; nil otherwise.
	Refused *refusedView
	// Report is the mesh as discovery and the verbs answer it; nil when it
	// could not be gathered, Err saying why.
	Report       *meshstatus.Report
	Err          string
	ComposeNodes int
}

// writerView is what the seat's holder writes: the registry, and the plan
// digests.
type writerView struct {
	// RegistryRevision and RegistryAt are the registry's last write of a
	// key, read from its stream; zero when it could not be (RegistryErr).
	RegistryRevision uint64
	RegistryAt       time.Time
	RegistryErr      string
	// CopyRevision is the revision this instance's copy of the registry
	// has reached.
	CopyRevision uint64
	// Plans is what this instance did of mesh-provisioner_plans; nil when
	// it reports none.
	Plans            *provisionerv1.PlansStats
	PlansLastPass    time.Duration
	PlansLastWritten time.Time
}

// connView is one of serve's connections to NATS.
type connView struct {
	Name string
	// Uses says what serve does on it.
	Uses string
	// URL is the server it is connected to (else the first it was given),
	// without credentials.
	URL       string
	Status    string
	Connected bool
	// Readiness says /readyz waits for it.
	Readiness bool
	Stats     nats.Statistics
	LastError string
}

// providersView is the providers the copy knows.
type providersView struct {
	Rows []providerRow
	// More counts the providers not listed.
	More int
	// Buckets and Keys count the providers' buckets the copy has named and
	// the keys it holds of them.
	Buckets, Keys int
}

// providerRow is one provider.
type providerRow struct {
	Provider string
	// Declared counts the nodes that declare a manifest of it; Manifest
	// is the newest's digest, shortened.
	Declared int
	Manifest string
	Bucket   string
	// State is "following", "behind" or "not-followed"; Follow says it.
	State, Follow string
	// Composed says Bound and Pending are known: counted over the nodes
	// the page composed.
	Composed       bool
	Bound, Pending int
}

// refusedView says which identity the page reads as, and what NATS refused
// it.
type refusedView struct {
	// As names the identity; Conn, User and Inbox say what the
	// connection shows of it (User and Inbox may be empty).
	As, Conn, User, Inbox string
	// What and Subject are what was refused ("subscription to _INBOX.x");
	// Err is nats.go's words when they name no subject.
	What, Subject, Err string
	Since              time.Time
}

// event is a recent error: what counted it, and how many it counted between
// two looks of the page.
type event struct {
	key  string
	look uint64
	// From and To bound when it happened, between two looks of the page;
	// From is zero when it happened at To.
	From, To time.Time
	What     string
	Counts   []count
	Detail   string
}

// count is one number of an event.
type count struct {
	N    uint64
	Name string
}

// String says the count as the page shows it: "dropped at the door: 3",
// "once", "4 times".
func (c count) String() string {
	switch {
	case c.Name == timesName && c.N == 1:
		return "once"
	case c.Name == timesName:
		return strconv.FormatUint(c.N, 10) + " " + timesName
	}
	return c.Name + ": " + strconv.FormatUint(c.N, 10)
}

// When says when the event happened, in UTC: a time, or the two looks of
// the page it happened between.
func (e event) When() string {
	to := e.To.UTC().Format(time.DateTime)
	if e.From.IsZero() {
		return to
	}
	if from := e.From.UTC().Format(time.DateTime); from != to {
		return from + " to " + to
	}
	return to
}

// timesName counts the page's own errors.
const timesName = "times"

// looks is what the page keeps from one look to the next: the counters it
// saw, so that the next tells what grew since; the recent errors; and
// whether NATS refused its identity.
type looks struct {
	mu sync.Mutex
	n  uint64    // looks made
	at time.Time // the last look's; zero before the first
	// seen are the counters at the last look, by event key and count name.
	seen   map[string]map[string]uint64
	events []event // the newest first
	// refused is NATS's refusal of the page's identity: Ask is asked no
	// more, so that a refresh costs NATS and the log nothing.
	refused *refusal
	// failureLogged is when a failure to read the mesh was last logged.
	failureLogged time.Time
}

// refusal is NATS's refusal of the page's identity.
type refusal struct {
	ask   *nats.Conn
	err   *meshstatus.RefusedError
	since time.Time
}

// counted is one source of errors as a look counts it.
type counted struct {
	key, what, detail string
	counts            []count
}

// look records, as events, what grew since the last look: since started,
// the instance's start, for the first.
func (l *looks) look(now, started time.Time, sources []counted) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	from := l.at
	if from.IsZero() {
		from = started
	}
	if l.seen == nil {
		l.seen = map[string]map[string]uint64{}
	}
	for _, src := range sources {
		was := l.seen[src.key]
		is := make(map[string]uint64, len(src.counts))
		var grew []count
		for _, c := range src.counts {
			is[c.Name] = c.N
			delta := c.N - was[c.Name]
			if c.N < was[c.Name] { // counted anew: another service
				delta = c.N
			}
			if delta > 0 {
				grew = append(grew, count{N: delta, Name: c.Name})
			}
		}
		l.seen[src.key] = is
		if len(grew) > 0 {
			l.record(event{key: src.key, From: from, To: now, What: src.what, Counts: grew, Detail: src.detail})
		}
	}
	l.at = now
}

// record adds e, made at the current look, to the recent errors: into the
// newest event of its key when that one was made or extended at the look
// before (one run of the same error is one line), else as the newest.
// l.mu is held.
func (l *looks) record(e event) {
	e.look = l.n
	if i := slices.IndexFunc(l.events, func(o event) bool { return o.key == e.key }); i >= 0 && l.events[i].look+1 >= e.look {
		o := l.events[i]
		l.events = slices.Delete(l.events, i, i+1)
		if o.From.IsZero() {
			o.From = o.To
		}
		e.From = o.From
		for _, c := range o.Counts {
			if j := slices.IndexFunc(e.Counts, func(n count) bool { return n.Name == c.Name }); j >= 0 {
				e.Counts[j].N += c.N
			} else {
				e.Counts = append(e.Counts, c)
			}
		}
		if e.Detail == "" {
			e.Detail = o.Detail
		}
	}
	l.events = slices.Insert(l.events, 0, e)
	if len(l.events) > maxEvents {
		l.events = l.events[:maxEvents]
	}
}

// happened records an error of the page itself, at now.
func (l *looks) happened(now time.Time, key, what, detail string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.record(event{key: key, To: now, What: what, Counts: []count{{N: 1, Name: timesName}}, Detail: detail})
}

// recent returns the recent errors, the newest first.
func (l *looks) recent() []event {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.events)
}

// refusedOn returns NATS's refusal of ask, if it refused it.
func (l *looks) refusedOn(ask *nats.Conn) *refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refused != nil && l.refused.ask == ask {
		return l.refused
	}
	return nil
}

// refuse records NATS's refusal of ask; it reports whether it is news.
func (l *looks) refuse(ask *nats.Conn, err *meshstatus.RefusedError, now time.Time) (*refusal, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.refused != nil && l.refused.ask == ask {
		return l.refused, false // another look saw it first
	}
	l.refused = &refusal{ask: ask, err: err, since: now}
	return l.refused, true
}

// logFailure reports whether a failure to read the mesh is logged now: at
// most once a minute, as ratelog would.
func (l *looks) logFailure(now time.Time) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if now.Sub(l.failureLogged) < time.Minute {
		return false
	}
	l.failureLogged = now
	return true
}

// What the page asks of the service beyond Service, when it has it:
// *service.Service does.
type (
	connLister interface {
		Conns() []service.Conn
	}
	providerLister interface {
		Providers() []service.ProviderState
		BoundBuckets() (buckets, keys int)
	}
)

// page renders the status page.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	now := time.Now().UTC()
	data := pageData{Service: wire.ServiceName, Now: now, Refresh: int(s.cfg.Refresh.Seconds()), ComposeNodes: s.cfg.ComposeNodes}
	data.NotReady = s.notReady()
	data.Ready = len(data.NotReady) == 0
	if t := s.current(); t != nil {
		stats := t.Service.Stats()
		in := meshstatus.InstanceOf(stats)
		data.ID, data.Version, data.Seat, data.SeatSince, data.SeatHolder = in.ID, in.Version, in.Seat, in.SeatSince, in.SeatHolder
		data.Conns = s.connections(t)
		s.looks.look(now, stats.Started, s.sources(stats, data.Conns))
		data.ErrorsSince = stats.Started
		if t.Ask != nil {
			data.Report, data.Refused, data.Err = s.read(r.Context(), t, now)
		}
		data.Writer = s.writer(r.Context(), t, in)
		data.Providers = providersOf(t.Service, data.Report)
		data.Errors = s.looks.recent()
	} else {
		data.Err = "not serving yet"
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := pageTemplate.Execute(w, data); err != nil {
		s.logger.Warn("rendering the status page", "err", err)
	}
}

// read gathers the mesh on t.Ask, unless NATS refused it already: then, and
// when it refuses it now, it says so instead, and logs it once.
func (s *Server) read(ctx context.Context, t *Target, now time.Time) (*meshstatus.Report, *refusedView, string) {
	if r := s.looks.refusedOn(t.Ask); r != nil {
		return nil, refusedViewOf(t, r), ""
	}
	ctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	report, err := meshstatus.Gather(ctx, t.Ask, meshstatus.Options{DiscoveryWait: s.cfg.DiscoveryWait, Records: true, ComposeNodes: s.cfg.ComposeNodes, FailOnRefusal: true})
	cancel()
	if err == nil {
		return report, nil, ""
	}
	if refused, ok := errors.AsType[*meshstatus.RefusedError](err); ok {
		r, news := s.looks.refuse(t.Ask, refused, now)
		view := refusedViewOf(t, r)
		if news {
			s.looks.happened(now, "page refused", "NATS refused the page's identity", refused.Error())
			s.logger.Warn("the status page's identity may not read the mesh: the page shows this instance alone and asks NATS no more on that connection; "+howToGiveOne,
				"reads_as", view.As, "connection", view.Conn, "user", view.User, "inbox_prefix", view.Inbox, "refused", refused.Error())
		}
		return nil, view, ""
	}
	s.looks.happened(now, "page failed", "the page could not read the mesh", err.Error())
	if s.looks.logFailure(now) {
		s.logger.Warn("the status page could not read the mesh", "err", err)
	}
	return nil, nil, err.Error()
}

// howToGiveOne says, in the log, how to give the page an identity that may
// read; the page says it too (page.html.tmpl).
const howToGiveOne = "give it an operator's identity, a NATS user with the permissions `mesh-provisioner permissions --operator NAME` prints: " +
	"serve --http-context with the operator's context (init writes contexts/operator-NAME.json), or " +
	"--http-nats-url nats://NAME:PASSWORD@HOST:PORT (or --http-creds FILE) --http-inbox-prefix " + "_INBOX_MESH.operator.NAME"

// refusedViewOf says what NATS refused the page's identity.
func refusedViewOf(t *Target, r *refusal) *refusedView {
	v := &refusedView{As: t.AskAs, Conn: t.Ask.Opts.Name, User: userOf(t.Ask), Inbox: inboxOf(t.Ask), Subject: r.err.Subject, Since: r.since}
	if v.As == "" {
		v.As = fmt.Sprintf("the identity of connection %q", v.Conn)
	}
	switch r.err.Verb {
	case "Subscription":
		v.What = "a subscription"
	case "Publish":
		v.What = "a publish"
	default:
		v.Err = r.err.Err.Error()
	}
	return v
}

// userOf returns the user a connection authenticates as, when it says:
// its user name, or its URL's when the URL holds a password too (a URL's
// lone user name is a token).
func userOf(nc *nats.Conn) string {
	if nc.Opts.User != "" {
		return nc.Opts.User
	}
	for _, raw := range append([]string{nc.Opts.Url}, nc.Opts.Servers...) {
		for part := range strings.SplitSeq(raw, ",") {
			if u, err := url.Parse(strings.TrimSpace(part)); err == nil && u.User != nil {
				if _, hasPassword := u.User.Password(); hasPassword {
					return u.User.Username()
				}
			}
		}
	}
	switch {
	case nc.Opts.UserJWT != nil:
		return "(a credentials file's)"
	case nc.Opts.Nkey != "":
		return "(an nkey's)"
	}
	return ""
}

// inboxOf returns a connection's inbox prefix.
func inboxOf(nc *nats.Conn) string {
	if nc.Opts.InboxPrefix != "" {
		return nc.Opts.InboxPrefix
	}
	return nats.InboxPrefix[:len(nats.InboxPrefix)-1] + " (nats.go's default)"
}

// redact returns a NATS URL list without credentials.
func redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, part := range parts {
		u, err := url.Parse(strings.TrimSpace(part))
		if err != nil {
			parts[i] = "(a URL that does not parse)"
			continue
		}
		if u.User != nil {
			u.User = url.User("xxxxx")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// connections lists serve's connections to NATS, each once: the service's,
// those /readyz waits for, the page's and /metrics'.
func (s *Server) connections(t *Target) []connView {
	type labelled struct {
		nc   *nats.Conn
		uses []string
	}
	var list []labelled
	// add lists nc for use; an empty use only lists it, as "serving".
	add := func(nc *nats.Conn, use string) {
		if nc == nil {
			return
		}
		if i := slices.IndexFunc(list, func(l labelled) bool { return l.nc == nc }); i >= 0 {
			if use != "" && !slices.Contains(list[i].uses, use) {
				list[i].uses = append(list[i].uses, use)
			}
			return
		}
		list = append(list, labelled{nc: nc, uses: []string{cmp.Or(use, "serving")}})
	}
	if c, ok := t.Service.(connLister); ok {
		for _, sc := range c.Conns() {
			add(sc.Conn, sc.Use)
		}
	}
	for _, nc := range t.Conns {
		add(nc, "")
	}
	add(t.Ask, "the status page")
	add(t.Read, "the buckets' last writes (/metrics, the page)")
	out := make([]connView, 0, len(list))
	for _, l := range list {
		nc := l.nc
		v := connView{Name: nc.Opts.Name, Uses: strings.Join(l.uses, ", "), Status: strings.ToLower(nc.Status().String()),
			Connected: nc.IsConnected(), Readiness: slices.Contains(t.Conns, nc), Stats: nc.Stats()}
		if v.URL = nc.ConnectedUrlRedacted(); v.URL == "" {
			v.URL = redact(cmp.Or(nc.Opts.Url, strings.Join(nc.Opts.Servers, ",")))
		}
		if err := nc.LastError(); err != nil {
			v.LastError = err.Error()
		}
		out = append(out, v)
	}
	return out
}

// sources are what a look counts: each endpoint's refusals and failures
// (the service's stats), NATS's refusals of serve's connections, by
// identity (CountRefusal), and each connection's reconnections.
func (s *Server) sources(stats micro.Stats, conns []connView) []counted {
	var out []counted
	for _, e := range stats.Endpoints {
		d, err := wire.DecodeStatsData(e.Data)
		if err != nil {
			d = &provisionerv1.EndpointStatsData{}
		}
		detail := ""
		if e.LastError != "" {
			detail = "last error: " + e.LastError
		}
		out = append(out, counted{key: "endpoint " + e.Name, what: "endpoint " + e.Name, detail: detail, counts: []count{
			{uint64(e.NumErrors) + d.GetRefused(), "refused on arrival"},
			{d.GetAnswerErrors(), "failed after acceptance"},
			{d.GetShed(), "shed after waiting too long"},
			{d.GetQueueFull(), "refused, the queue full"},
			{d.GetAskerFull(), "refused, their asker at its bound"},
			{d.GetDropped(), "dropped at the door"},
			{d.GetLargeShed(), "large answers refused"},
			{d.GetSlowConsumer(), "slow-consumer drops"},
			{d.GetRefusedReplies(), "unanswered, their reply subject refused"},
		}})
	}
	for identity, n := range s.refusals() {
		out = append(out, counted{key: "refused " + identity, what: fmt.Sprintf("NATS refused %s's connections", identity),
			detail: "publishes or subscriptions its permissions do not grant, each logged at most once a minute",
			counts: []count{{n, "publishes or subscriptions"}}})
	}
	for _, c := range conns {
		out = append(out, counted{key: "conn " + c.Name + " " + c.Uses, what: fmt.Sprintf("connection %q (%s)", c.Name, c.Uses),
			counts: []count{{c.Stats.Reconnects, "reconnections"}}})
	}
	slices.SortStableFunc(out, func(a, b counted) int { return strings.Compare(a.key, b.key) })
	return out
}

// refusals returns what CountRefusal counted, by identity.
func (s *Server) refusals() map[string]uint64 {
	ch := make(chan prometheus.Metric, 16)
	go func() {
		s.refused.Collect(ch)
		close(ch)
	}()
	out := map[string]uint64{}
	for m := range ch {
		var pb dto.Metric
		if err := m.Write(&pb); err != nil {
			continue
		}
		for _, l := range pb.GetLabel() {
			if l.GetName() == "identity" {
				out[l.GetValue()] = uint64(pb.GetCounter().GetValue())
			}
		}
	}
	return out
}

// writer returns the registry's last write, as its stream has it, and what
// this instance did of the plans.
func (s *Server) writer(ctx context.Context, t *Target, in meshstatus.Instance) *writerView {
	w := &writerView{Plans: in.Plans}
	for _, c := range t.Service.Copies() {
		if c.Bucket == keys.RegistryBucket {
			w.CopyRevision = c.Revision
		}
	}
	if p := in.Plans; p != nil {
		w.PlansLastPass = time.Duration(p.GetLastPassMs()) * time.Millisecond
		if at, err := time.Parse(time.RFC3339Nano, p.GetLastWritten()); err == nil {
			w.PlansLastWritten = at
		}
	}
	if t.Read == nil {
		w.RegistryErr = "no connection to read it on"
		return w
	}
	ctx, cancel := context.WithTimeout(ctx, min(s.cfg.Timeout, 2*time.Second))
	defer cancel()
	revision, at, err := lastWrite(ctx, t.Read, keys.RegistryBucket)
	if err != nil {
		w.RegistryErr = err.Error()
		return w
	}
	w.RegistryRevision, w.RegistryAt = revision, at
	return w
}

// lastWrite returns the revision and time of the bucket's last write of a
// key (0 and the zero time for a bucket without one), by direct get as the
// server's writing identity may (kvread.Last), on nc's account's
// JetStream API.
func lastWrite(ctx context.Context, nc *nats.Conn, bucket string) (uint64, time.Time, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0, time.Time{}, err
	}
	msg, err := kvread.Last(ctx, js, wire.StreamOf(bucket), wire.KVSubject(bucket, ">"))
	switch {
	case errors.Is(err, kvread.ErrNoMessage):
		return 0, time.Time{}, nil
	case err != nil:
		return 0, time.Time{}, err
	}
	revision, err := strconv.ParseUint(msg.Header.Get(jetstream.SequenceHeader), 10, 64)
	if err != nil {
		return 0, time.Time{}, err
	}
	at, err := time.Parse(time.RFC3339Nano, msg.Header.Get(jetstream.TimeStampHeaer))
	if err != nil {
		return revision, time.Time{}, nil //nolint:nilerr // the revision is known; the time is not
	}
	return revision, at, nil
}

// providersOf lists the providers the service's copy knows, with what the
// report's compositions counted of them; nil when the service says none.
func providersOf(svc Service, report *meshstatus.Report) *providersView {
	lister, ok := svc.(providerLister)
	if !ok {
		return nil
	}
	v := &providersView{}
	v.Buckets, v.Keys = lister.BoundBuckets()
	rows := map[string]*providerRow{}
	for _, p := range lister.Providers() {
		row := &providerRow{Provider: p.Provider, Declared: p.Declared, Manifest: short(p.Manifest), Bucket: p.Bucket}
		switch {
		case p.Followed && !p.Behind:
			row.State, row.Follow = "following", fmt.Sprintf("follows it, up to revision %d", p.Revision)
		case p.Followed:
			row.State, row.Follow = "behind", fmt.Sprintf("cannot read it now: holds its keys up to revision %d", p.Revision)
		case p.Behind:
			row.State, row.Follow = "behind", "named, its keys not in: not read yet, or it may not be read (the writing identity's grant: permissions --server-writer --providers "+p.Provider+")"
		default:
			row.State, row.Follow = "not-followed", notFollowed
		}
		rows[p.Provider] = row
	}
	if report != nil {
		for _, p := range report.Providers {
			row := rows[p.Provider]
			if row == nil {
				row = &providerRow{Provider: p.Provider, Manifest: short(p.Manifest), Bucket: wire.BoundBucket(p.Provider),
					State: "not-followed", Follow: notFollowed}
				rows[p.Provider] = row
			}
			row.Composed, row.Bound, row.Pending = true, p.Bound, p.Pending
		}
	}
	names := slices.Sorted(maps.Keys(rows))
	if len(names) > maxProviders {
		v.More = len(names) - maxProviders
		names = names[:maxProviders]
	}
	for _, name := range names {
		v.Rows = append(v.Rows, *rows[name])
	}
	return v
}

// notFollowed says a provider's bucket is not followed: the copy does not
// tell these apart (service.Service.Providers).
const notFollowed = "not followed: no composition names it yet, or it is empty or missing"

// short shortens a digest for the page.
func short(digest string) string {
	if len(digest) > 12 {
		return digest[:12]
	}
	return digest
}

// compose answers a node's composition as protobuf JSON, asked of the
// compose verb (every page of it), as the verb's error code otherwise.
func (s *Server) compose(w http.ResponseWriter, r *http.Request) {
	node := r.PathValue("node")
	t := s.current()
	if t == nil || t.Ask == nil {
		http.Error(w, "503: not serving yet", http.StatusServiceUnavailable)
		return
	}
	if err := keys.CheckToken(node); err != nil {
		http.Error(w, "400: "+err.Error(), http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	res, err := client.New(t.Ask).ComposeAll(ctx, &provisionerv1.ComposeRequest{Node: node})
	if err != nil {
		code := http.StatusBadGateway
		var werr *wire.Error
		if errors.As(err, &werr) {
			code = int(werr.Code())
		}
		http.Error(w, err.Error(), code)
		return
	}
	b, err := protojson.MarshalOptions{Multiline: true, Indent: "  "}.Marshal(res)
	if err != nil {
		http.Error(w, "500: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_, _ = w.Write(append(b, '\n'))
}

package ops

import (
	"context"
	"embed"
	"errors"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protojson"

	"github.com/novox/mesh-provisioner/client"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/meshstatus"
	"github.com/novox/mesh-provisioner/keys"
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
}).ParseFS(pageFS, "page.html.tmpl"))

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
	// Report is the mesh as discovery and the verbs answer it; nil when it
	// could not be gathered, Err saying why.
	Report       *meshstatus.Report
	Err          string
	ComposeNodes int
}

// page renders the status page.
func (s *Server) page(w http.ResponseWriter, r *http.Request) {
	data := pageData{Service: wire.ServiceName, Now: time.Now().UTC(), Refresh: int(s.cfg.Refresh.Seconds()), ComposeNodes: s.cfg.ComposeNodes}
	data.NotReady = s.notReady()
	data.Ready = len(data.NotReady) == 0
	if t := s.current(); t != nil {
		in := meshstatus.InstanceOf(t.Service.Stats())
		data.ID, data.Version, data.Seat, data.SeatSince, data.SeatHolder = in.ID, in.Version, in.Seat, in.SeatSince, in.SeatHolder
		if t.Ask != nil {
			ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
			report, err := meshstatus.Gather(ctx, t.Ask, meshstatus.Options{DiscoveryWait: s.cfg.DiscoveryWait, Records: true, ComposeNodes: s.cfg.ComposeNodes})
			cancel()
			if err != nil {
				data.Err = err.Error()
			} else {
				data.Report = report
			}
		}
	} else {
		data.Err = "not serving yet"
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if err := pageTemplate.Execute(w, data); err != nil {
		s.logger.Warn("rendering the status page", "err", err)
	}
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

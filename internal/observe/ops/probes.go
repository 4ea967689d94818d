package ops

import (
	"fmt"
	"net/http"
	"strings"
)

// healthz answers 200 while the process runs.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprintln(w, "ok")
}

// readyz answers 200 while the service answers right, or 503 with why not.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	if why := s.notReady(); len(why) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintln(w, "not ready: "+strings.Join(why, "; "))
		return
	}
	fmt.Fprintln(w, "ready")
}

// notReady lists why the service is not ready; empty when it is.
func (s *Server) notReady() []string {
	if s.stopping.Load() {
		return []string{"stopping"}
	}
	t := s.current()
	if t == nil {
		return []string{"starting: not serving yet (connecting to NATS, or creating and opening the buckets)"}
	}
	var why []string
	for _, nc := range t.Conns {
		if !nc.IsConnected() {
			why = append(why, fmt.Sprintf("NATS is not connected (connection %q is %s)", nc.Opts.Name, strings.ToLower(nc.Status().String())))
		}
	}
	if err := t.Service.Ready(); err != nil {
		why = append(why, err.Error())
	}
	return why
}

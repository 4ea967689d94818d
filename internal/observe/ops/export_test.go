package ops

import "github.com/prometheus/client_golang/prometheus"

// Gatherer returns the registry s's /metrics serves, for the tests to lint.
func Gatherer(s *Server) prometheus.Gatherer { return s.registry }

// ServiceCollector returns the collector that reads s's attached service,
// for the tests to lint alone on a pedantic registry.
func ServiceCollector(s *Server) prometheus.Collector { return &serviceCollector{s: s} }

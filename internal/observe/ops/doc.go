// Package ops serves what operators probe a service with over HTTP, off by
// default and enabled by serve --http:
//
//   - /healthz: 200 while the process runs;
//   - /readyz: 200 only while the service's endpoints are registered, its
//     copy is whole and not behind, and NATS is connected; otherwise 503,
//     the body saying why not;
//   - /metrics: the Prometheus text format (client_golang), read from the
//     same counters micro's $SRV.STATS reports, plus latency histograms by
//     endpoint and code, the copy's revision and lag per bucket and the seat;
//   - /: a status page, server-rendered with html/template, that refreshes
//     itself, and /nodes/{node}/compose, a node's composition as JSON, asked
//     of the compose verb.
//
// /healthz and /readyz answer anyone. The others show what the mesh confines
// over NATS (any node's composition), so they answer only a request whose
// Host is one of [Config.Hosts] (421 otherwise: no DNS rebinding) and that
// carries [Config.Token] as "Authorization: Bearer <token>" (401 otherwise,
// 403 to everyone when no token is configured).
//
// [Start] listens at once (so that a busy address fails fast) and answers
// /healthz from then on; [Server.Attach] hands it the running service, after
// which /readyz, /metrics and the page report on it.
package ops

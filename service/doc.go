// Package service serves the mesh-provisioner micro service, the only
// writer of the mesh's buckets, from three rooms it holds together:
//
//   - admission (package service/admission): who asks, where an answer may
//     go, how much one asker takes, and what a node may write;
//   - answers (package service/answers): the read verbs answered from the
//     copy, their encodings, pages and the answer cache;
//   - plans (package service/plans): the writer of each node's plan digest.
//
// This package is what joins them to NATS: [Start] opens the watched copy of
// the buckets (package internal/mirror; create the buckets first with
// buckets.Ensure) and adds the micro service with one endpoint per verb, a
// door before each endpoint that names its asker, and the workers that
// build answers; the write verbs (put, delete, apply and declare of a node,
// bind of a provider) check each write with the admission room and store it
// with the writing identity's connection (Config.WatchConn);
// [Service.RunPlans], which the seat's holder runs, runs the plans room's
// writer on the copy; the endpoints' stats and the status page read what
// each room counts.
//
// Until every watcher has delivered its bucket's initial values the
// endpoints answer 503, but an instance alone on the bus answers a node's
// reads from that node's keys read alone; after that, every answer comes
// from the copy and carries the revisions the copy had reached. Errors
// follow the NATS service API (Nats-Service-Error and
// Nats-Service-Error-Code headers) with the codes of package wire.
package service

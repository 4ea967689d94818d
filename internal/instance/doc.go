// Package instance assembles one mesh-provisioner instance: the one place
// that, given its connections, checks JetStream, ensures the buckets, binds
// the provisioner seat, starts the service (which loads the copy and serves
// the verbs), and, while this instance holds the seat, reconciles the
// registry and writes the nodes' plan digests.
//
// serve, the test harness (internal/testkit/servicetest) and every benchmark
// that runs an instance in-process call it with a Config; no other package
// assembles one. The caller connects, since the identities' credentials are
// its own (natscli contexts, creds files, a test's users), and owns the
// connections: it drains them after Run (or Stop) returns.
//
// Start returns an instance that answers (503 while its copy loads) but
// neither contends for the seat nor writes. Contend contends for it until
// its context ends, then leaves the instance answering as a standby; Run
// is Contend, then the service stopped, as serve runs it. A harness that
// writes the registry itself uses Start alone.
package instance

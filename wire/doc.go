// Package wire holds the names and the error of the mesh-provisioner wire
// contract, shared by the server and every Go client: every name on the bus
// (the service's, the verbs' subjects, the buckets' streams and key
// subjects, the seat's subject, the inbox prefix of each identity and the
// reply prefixes the service answers to, a provider's bucket), the content
// types, a manifest's digest ([ManifestDigest]), and [Error], the coded
// error a verb answers with.
//
// It imports of the project only the generated types (the stats data's
// message), and of the outside world nats.go (a reply's headers, micro's
// header names) and protobuf, so a client links no server code. The buckets' names are package keys', beside the keys they hold,
// so that package compose, which reads keys, links no NATS package.
package wire

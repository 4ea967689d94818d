// Package wire holds the names and the error of the mesh-provisioner wire
// contract, shared by the server and every Go client: the service's name,
// the verbs' subjects, the content types, the inbox prefix of each identity,
// the streams behind the buckets, and [Error], the coded error a verb answers
// with.
//
// It imports nothing of the project but the generated protobuf types, so a
// client links no server code.
package wire

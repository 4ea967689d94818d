// Package seat holds the provisioner seat: of any number of mesh-provisioner
// instances serving one mesh, exactly one holds the seat, and only it writes
// the registry.
//
// The seat is a lease kept by JetStream, not a consensus of its own: one
// message on the subject wire.SeatSubject of the registry bucket's stream,
// holding the holder's id, published with a per-message TTL (Nats-TTL) and
// compare-and-set on the subject's last sequence (Nats-Expected-Last-Subject-
// Sequence). Its states are:
//
//   - vacant: no message on the subject (never held, or its TTL ran out and
//     the stream removed it) or an empty one (handed back on a clean stop);
//   - held at sequence S: the holder's message, renewed every TTL/12 by a
//     publish that expects S and so yields S'. A failed renewal is tried
//     again every 100ms until the lease runs out by the holder's own clock,
//     so that the holder keeps its seat through any leader election of the
//     stream that ends before its lease does.
//
// A standby reads the subject's last message every Config.Poll and, when the
// seat is vacant, publishes its own lease expecting what it read: of several
// standbys one wins, the others' publishes are refused by the stream.
//
// Fencing: every registry write goes through [Seat.PublishMsg], which adds
// Nats-Expected-Last-Subject-Sequence: S with
// Nats-Expected-Last-Subject-Sequence-Subject: wire.SeatSubject. The stream
// checks it against its own state in the same order as it stores messages: a
// former holder whose lease expired (the message was removed) or was taken
// over (the subject's last sequence is another's) has its write refused,
// however long it was paused, whatever its clock says.
package seat

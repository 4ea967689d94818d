// Package admission is the admission room of the service: what it decides
// about a request before answering it, from what the request cannot lie
// about.
//
//   - Who asks: nats-server confines a node or provider to its own
//     subjects, so the subject's token names the asker ([AskerToken],
//     [Asker]); [CheckName] and [CheckAddress] refuse a name no key can
//     hold, and [ConfineProvisioning] and [ConfineCompose] a node's request
//     for another node's records or plan.
//   - Where the answer goes: [Replies] answers only under the configured
//     reply prefixes ([CheckReplyPrefixes]) and, on an asker's own
//     subject, only on the asker's own inbox, so that an answer never
//     lends the service's rights to whoever chose the reply subject.
//   - How much one asker takes: a [Door] in front of each addressed
//     endpoint, one line and one rate an asker, drops an asker's excess
//     before it can displace another's request; [Places] bound what one
//     asker holds of the queue and the waits; [Flights] let identical
//     requests share one answer being built; [BurstLog] logs a flood's
//     drops twice, not once a drop.
//   - What a node may write: [OwnKey] (its own keys, in shape) and
//     [CheckValue] (within the bucket's size, decoding as the copy would,
//     within the node's budget).
//
// The service wires these into its endpoints; nothing here sends an answer.
package admission

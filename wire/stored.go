package wire

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go/jetstream"
)

// A state bucket (needs, applied records, items) of a partitioned mesh
// stores each key under its node's partition, so that an instance serving
// some partitions reads their keys alone: its stream's subject transform,
// which nats-server applies to each message as it stores it, maps
// $KV.<bucket>.<node>.<rest> to $KV.<bucket>.<partition>.<node>.<rest>, the
// partition computed of the node's token as the verbs' mapping computes it
// (PartitionOf). Writers publish to the key's subject as ever, and a KV
// put, update at a revision or delete keeps its meaning: nats-server checks
// a write's expected revision on the subject it stores. A reader that names
// a node's subjects (a consumer's filter, a direct get) names the stored
// ones; a KV Get by key finds nothing, and so a KV Create of a deleted key,
// which nats.go reads back by key, is refused as if the key existed (the
// service puts and deletes only). A key that is a node's name alone
// (malformed, one token) is not transformed.
//
// The layout is the stream's, chosen when the bucket is made
// (buckets.Config.Partitions): a stream that holds keys is never moved to
// another, which would leave its keys split between two.

// StoredKeys is how a state bucket stores its keys: under their node's
// partition of Partitions, or as written when Partitions is 0.
type StoredKeys struct {
	Bucket     string
	Partitions int
}

// storedDestination is the transform's destination after the bucket's
// prefix; StoredKeysOf parses it back.
const storedDestination = "{{partition(%d,1)}}.{{wildcard(1)}}.>"

// Transform returns the stream's subject transform that stores the keys so,
// nil when they are stored as written.
func (s StoredKeys) Transform() *jetstream.SubjectTransformConfig {
	if s.Partitions == 0 {
		return nil
	}
	return &jetstream.SubjectTransformConfig{
		Source:      KVPrefix(s.Bucket) + "*.>",
		Destination: KVPrefix(s.Bucket) + fmt.Sprintf(storedDestination, s.Partitions),
	}
}

// StoredKeysOf returns how a bucket's stream of subject transform tr (nil
// for none) stores its keys; a transform this package did not make is an
// error, since its stored subjects name no key a reader could find.
func StoredKeysOf(bucket string, tr *jetstream.SubjectTransformConfig) (StoredKeys, error) {
	s := StoredKeys{Bucket: bucket}
	if tr == nil {
		return s, nil
	}
	rest, ok := strings.CutPrefix(tr.Destination, KVPrefix(bucket))
	if ok {
		_, err := fmt.Sscanf(rest, storedDestination, &s.Partitions)
		ok = err == nil && s.Partitions > 0 && s.Partitions <= MaxPartitions
	}
	if !ok || *s.Transform() != *tr {
		return StoredKeys{}, fmt.Errorf("bucket %s's stream maps its subjects %q to %q, which mesh-provisioner does not read: remove the transform (an empty bucket) or keep the one it sets, %q", bucket, tr.Source, tr.Destination, KVPrefix(bucket)+"{{partition(<n>,1)}}.{{wildcard(1)}}.>")
	}
	return s, nil
}

// Key returns the key of a stored subject of the bucket, false for another
// bucket's.
func (s StoredKeys) Key(subject string) (string, bool) {
	stored, ok := strings.CutPrefix(subject, KVPrefix(s.Bucket))
	if !ok {
		return "", false
	}
	return s.KeyOfStored(stored), true
}

// KeyOfStored returns the key of a stored one: a stored subject after the
// bucket's prefix, as a KV entry of the bucket names it.
func (s StoredKeys) KeyOfStored(stored string) string {
	if s.Partitions == 0 {
		return stored
	}
	if _, key, partitioned := strings.Cut(stored, "."); partitioned {
		return key
	}
	return stored // a node's name alone
}

// NodePrefix returns the stored subject of node's keys but its name alone,
// to which a wildcard is appended: "$KV.<bucket>.[<partition>.]<node>.".
func (s StoredKeys) NodePrefix(node string) string {
	if s.Partitions == 0 {
		return KVPrefix(s.Bucket) + node + "."
	}
	return KVPrefix(s.Bucket) + strconv.Itoa(PartitionOf(node, s.Partitions)) + "." + node + "."
}

// NodeKeys returns the filter of a KV watcher of the bucket (after its
// prefix) that names node's stored keys but its name alone:
// "[<partition>.]<node>.>".
func (s StoredKeys) NodeKeys(node string) string {
	return strings.TrimPrefix(s.NodePrefix(node), KVPrefix(s.Bucket)) + ">"
}

// HeldSubjects returns the stored subjects of the keys of the nodes in the
// partitions held, held[p] for each partition p of a mesh of len(held), for
// a consumer's filter; nil for every key of the bucket, when held holds
// every partition, and when the keys are stored as written or under a
// count of partitions that len(held) does not divide, since then the
// subjects do not tell a key's partition.
func (s StoredKeys) HeldSubjects(held []bool) []string {
	if len(held) == 0 || s.Partitions == 0 || s.Partitions%len(held) != 0 {
		return nil
	}
	// A node's name alone, one token, is stored as written: rare, and read
	// of every node.
	subjects := []string{KVPrefix(s.Bucket) + "*"}
	for p := range s.Partitions {
		if held[p%len(held)] {
			subjects = append(subjects, KVPrefix(s.Bucket)+strconv.Itoa(p)+".>")
		}
	}
	if len(subjects) == s.Partitions+1 {
		return nil
	}
	return subjects
}

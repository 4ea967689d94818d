package wire

import (
	"hash/fnv"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go/micro"
)

// A mesh may split its nodes and providers into partitions, so that the
// service can shut one partition's askers out at nats-server (a flood of
// one of them) while it answers every other. nats-server does the routing:
// a subject mapping appends the asker's partition to each addressed verb's
// subject, mesh-provisioner.compose.ace becoming
// mesh-provisioner.compose.ace.3, and the service subscribes to each
// partition's subjects apart. Clients publish as before.
//
// nats-server applies a mapping before it checks the publisher's
// permissions, so a node's grant names its mapped subjects
// (permissions.Partitioned): with a wildcard in their place, a node could
// publish into another partition.

// MaxPartitions is the most partitions a mesh may be split into.
const MaxPartitions = 1024

// addressedSubjects are the verbs' subjects whose next token names the
// asker, with how many tokens follow it (the declare verb's provider).
var addressedSubjects = []struct {
	subject string
	after   int
}{
	{ProvisioningSubject, 0}, {ComposeSubject, 0},
	{PutSubject, 0}, {DeleteSubject, 0}, {ApplySubject, 0},
	{DeclareSubject, 1},
	{ProvisionsSubject, 0}, {BindSubject, 0},
}

// PartitionOf returns the partition of a node or provider among n, as
// nats-server's {{partition(n,1)}} computes it of the name's token: FNV-1a
// (32 bits) of the name, modulo n.
func PartitionOf(name string, n int) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return int(h.Sum32() % uint32(n))
}

// Mapping is one subject mapping of a nats-server configuration.
type Mapping struct{ Source, Destination string }

// PartitionMappings returns the subject mappings of a mesh of n partitions:
// each addressed verb's subject to itself with the asker's partition
// appended.
func PartitionMappings(n int) []Mapping {
	out := make([]Mapping, 0, len(addressedSubjects))
	for _, a := range addressedSubjects {
		source, destination := a.subject+".*", a.subject+".{{wildcard(1)}}"
		for i := range a.after {
			source += ".*"
			destination += ".{{wildcard(" + strconv.Itoa(i+2) + ")}}"
		}
		out = append(out, Mapping{source, destination + ".{{partition(" + strconv.Itoa(n) + ",1)}}"})
	}
	return out
}

// PartitionedSubject returns subject as a mesh of n partitions maps it: an
// addressed verb's subject with its asker's partition appended; any other
// subject as it is.
func PartitionedSubject(subject string, n int) string {
	for _, a := range addressedSubjects {
		rest, ok := strings.CutPrefix(subject, a.subject+".")
		if !ok || strings.Count(rest, ".") != a.after {
			continue
		}
		name, _, _ := strings.Cut(rest, ".")
		return subject + "." + strconv.Itoa(PartitionOf(name, n))
	}
	return subject
}

// PartitionOfInstance is the metadata key of a partition's micro instance
// that names the instance (its micro ID) whose partition it is: discovery
// folds the partition's endpoints into that instance's (FoldPartitions).
const PartitionOfInstance = "instance"

// MemberMetadata is the metadata key of an instance's own micro instance
// when it shares the mesh's partitions with the others that tell it (serve
// --hold auto): its name among them, which decides the partitions it
// serves.
const MemberMetadata = "member"

// PartitionsMetadata is the metadata key, on a member's micro instance and
// on a partition's, of how many partitions the instance splits the mesh
// into (serve --partitions): instances of different counts share nothing,
// a partition's index naming other nodes in each.
const PartitionsMetadata = "partitions"

// FoldPartitions returns an instance's $SRV.STATS with its partitions'
// endpoints folded in: each addressed endpoint's micro counts summed over
// the partitions, on its subject with "*" for the partition, its data one
// partition's (the endpoint's whole).
func FoldPartitions(instance micro.Stats, partitions []micro.Stats) micro.Stats {
	summed := map[string]*micro.EndpointStats{}
	for _, p := range partitions {
		for _, e := range p.Endpoints {
			sum, ok := summed[e.Name]
			if !ok {
				sum = &micro.EndpointStats{Name: e.Name, QueueGroup: e.QueueGroup, Data: e.Data, Subject: e.Subject[:strings.LastIndexByte(e.Subject, '.')+1] + "*"}
				summed[e.Name] = sum
				instance.Endpoints = append(instance.Endpoints, sum)
			}
			if len(sum.Data) == 0 {
				sum.Data = e.Data
			}
			sum.NumRequests += e.NumRequests
			sum.NumErrors += e.NumErrors
			sum.ProcessingTime += e.ProcessingTime
			if e.LastError != "" {
				sum.LastError = e.LastError
			}
		}
	}
	for _, sum := range summed {
		if sum.NumRequests > 0 {
			sum.AverageProcessingTime = sum.ProcessingTime / time.Duration(sum.NumRequests)
		}
	}
	return instance
}

// RelayRoot starts the subjects on which an instance that serves some
// partitions of the mesh (serve --hold) hands on a request about nodes it
// does not hold to an instance that holds them:
// mesh-provisioner.partition.<the verb's subject after the service's
// name>.<p>, each instance subscribing to those of the partitions it holds.
// The partition comes last, as on the addressed subjects: discovery folds
// the partitions' relay endpoints as it folds theirs (FoldPartitions). The
// instance asks on its own inbox, and sends the holder's answer on to the
// asker. Only the service's answering identity publishes there, and
// operators, who may ask every verb of every node (and are not answered
// there: a holder answers the service's inbox alone).
const RelayRoot = ServiceName + ".partition"

// RelaySubject returns the subject on which a request asked on subject, a
// verb's, is handed to a holder of partition p.
func RelaySubject(p int, subject string) string {
	return RelayRoot + "." + strings.TrimPrefix(subject, ServiceName+".") + "." + strconv.Itoa(p)
}

// Unrelayed returns the subject a request handed on subject (RelaySubject)
// was asked on, and the partition it was handed to; ok is false for a
// subject that is not a relay subject.
func Unrelayed(subject string) (asked string, p int, ok bool) {
	rest, ok := strings.CutPrefix(subject, RelayRoot+".")
	if !ok {
		return "", 0, false
	}
	dot := strings.LastIndexByte(rest, '.')
	if dot <= 0 {
		return "", 0, false
	}
	p, err := strconv.Atoi(rest[dot+1:])
	if err != nil || p < 0 || p >= MaxPartitions {
		return "", 0, false
	}
	return ServiceName + "." + rest[:dot], p, true
}

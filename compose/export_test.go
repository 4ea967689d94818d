package compose

import provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"

// DigestedBytes is how many bytes Digest hashes of c (each collection's
// items, hashed apart, not counted), for BenchmarkDigest's baseline.
func DigestedBytes(c *provisionerv1.ComposeResponse) int {
	var g grouper
	g.digest(c)
	hashed := g.hashed
	return hashed
}

// AppendCollectItem and AppendMessage are the digest's two writers of a
// collected item, which TestAppendCollectItem holds to the same bytes.
func AppendCollectItem(b []byte, item *provisionerv1.CollectItem) []byte {
	return appendCollectItem(b, item)
}

func AppendMessage(b []byte, item *provisionerv1.CollectItem) []byte {
	return appendMessage(b, item)
}

// ProviderBucketsKept counts the providers' buckets the arena's entries
// keep, for TestAnArenaKeepsSomeProvidersBuckets.
func ProviderBucketsKept(a *Arena) int {
	n := 0
	for _, r := range a.resolved.byKind {
		n += len(r.buckets)
	}
	return n
}

const MaxProviderBuckets = maxProviderBuckets

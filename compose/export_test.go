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

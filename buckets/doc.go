// Package buckets administers the five provisioning buckets and the plans
// bucket (mesh-provisioner_plans): [Ensure]
// creates the missing ones and keeps every state bucket's stream configured
// as the mesh's safety needs (no rollups; a maximum value size and total
// size that nats-server enforces on every writer).
package buckets

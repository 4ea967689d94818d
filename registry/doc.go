// Package registry holds the mesh's registry: for every kind of placeholder,
// which module answers it and where a client finds the values.
//
// The table ([Table]) is a typed literal of the generated protobuf type,
// compiled into the binary and validated when the package loads
// ([Validate]). [Reconcile] writes it to the registry bucket only where the
// bucket differs and deletes kinds no entry answers any more; a [Reconciler]
// does that at start and on an interval. [keyshape.Parse] reads the key shapes
// entries give, and renders concrete keys from them.
package registry

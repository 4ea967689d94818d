// Package keyshape reads the key shapes and templates that registry entries
// give, such as "<node>.<module>.<provision>[.<local>]", and renders the
// concrete keys and collection names a need resolves to.
//
// It is pure: no I/O, so that both the registry, which validates its table
// with it, and the composer, which renders a key for every need, use the one
// reading of a shape.
package keyshape

// Package meshstatus gathers what an operator of a mesh looks at: the
// instances serving (micro discovery), each bucket's stream and the copy's
// revision and lag, the nodes with their needs, refusals and provisions, and
// every malformed key. The status command prints it; the status page of
// serve --http shows it.
package meshstatus

// Package keys names the provisioning buckets of a mesh and is the one place
// that parses and formats their keys.
//
// A key is dot-separated tokens; a token holds only A-Z a-z 0-9 - _ = /.
// The buckets and their key shapes are:
//
//	mesh-provisioner_registry  <kind>
//	mesh-provisioner_needs     <node>.<module>.<kind>.<name>
//	mesh-provisioner_applied   <node>.<module>
//	mesh-provisioner_collect   <node>.<collection>.<contributor>
//
// A collection's name, and a need's name, are escaped in their keys: every
// byte a token cannot hold, and '=' itself, is written '=' followed by two
// upper-case hex digits, so the collection "shell:zsh:normal" is the token
// "shell=3Azsh=3Anormal", and the need of ${shell:zsh:normal} is keyed
// <node>.<module>.shell.zsh=3Anormal. Parsers return the readable name;
// [Escape] and [Unescape] are a bijection between byte strings and
// well-formed tokens.
//
// Parsers never panic: they return the parts of a key, or an error wrapping
// [ErrMalformedKey] whose text says what is wrong. Formatters check every part
// and return an error wrapping [ErrInvalidPart] before a key is built.
package keys

package admission

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/novox/mesh-provisioner/wire"
)

// ErrReplyPrefix is returned by service.Start for a Config.ReplyPrefixes entry that
// could let an answer reach a subject other than an inbox.
var ErrReplyPrefix = errors.New("a reply prefix must be a subject's leading tokens ending in \".\", not under \"$\"")

// CheckReplyPrefixes refuses a prefix that is empty, does not end a token,
// holds a wildcard or a space, or starts with "$": any of them would let a
// request aim an answer at JetStream's API, a KV key or a system subject.
func CheckReplyPrefixes(prefixes []string) error {
	if len(prefixes) == 0 {
		return fmt.Errorf("%w: no prefix is given, so no request could be answered", ErrReplyPrefix)
	}
	for _, p := range prefixes {
		if !strings.HasSuffix(p, ".") || strings.HasPrefix(p, "$") || strings.HasPrefix(p, ".") ||
			strings.ContainsAny(p, "*> \t\r\n") || strings.Contains(p, "..") {
			return fmt.Errorf("%w: %q", ErrReplyPrefix, p)
		}
	}
	return nil
}

// Replies are the reply subjects a service answers on.
type Replies struct {
	prefixes []string
}

// NewReplies returns the replies under prefixes, which CheckReplyPrefixes
// accepts.
func NewReplies(prefixes []string) *Replies {
	return &Replies{prefixes: slices.Clone(prefixes)}
}

// AnswersTo reports whether the service may answer on reply: an inbox under
// one of its reply prefixes. An answer is a publish with the service's
// rights; aimed anywhere else, it would lend them to whoever asked.
//
// A request on an owner's own subject (a node's, a provider's) is the
// owner's, whose grant uses its own inbox prefix: it is answered there, or
// across an import (_R_.), which in runs-as is the asker's own account, and
// nowhere else, not an operator's inbox nor nats.go's _INBOX. Another
// request (on a verb's bare subject, which no node's or provider's grant may
// publish to, or naming one no identity can have) is answered into no
// node's or provider's inbox.
func (r *Replies) AnswersTo(reply string, owner wire.Role, name string) bool {
	if !r.underPrefixes(reply) {
		return false
	}
	if owner != "" && CheckAddress(owner, name) == nil {
		return strings.HasPrefix(reply, wire.InboxPrefix(owner, name)+".") || strings.HasPrefix(reply, wire.CrossAccountReplyPrefix)
	}
	// A bare subject, or a name no identity can have (which no grant
	// names, so no node or provider asked it): its 400 goes to no node's
	// or provider's inbox either.
	return !strings.HasPrefix(reply, wire.InboxPrefix(wire.RoleNode, "")) && !strings.HasPrefix(reply, wire.InboxPrefix(wire.RoleProvider, ""))
}

// underPrefixes reports whether reply is under one of the prefixes, and
// longer than it.
func (r *Replies) underPrefixes(reply string) bool {
	for _, p := range r.prefixes {
		if len(reply) > len(p) && strings.HasPrefix(reply, p) {
			return true
		}
	}
	return false
}

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"sync"

	"github.com/novox/mesh-provisioner/wire"
)

// Errors a client command returns when NATS refused what its request needed:
// each is wrapped with the subject and what to do.
var (
	// ErrInboxRefused: NATS refused the subscription to the reply inbox, so
	// no answer can arrive; the identity connected with an inbox prefix its
	// permissions do not grant.
	ErrInboxRefused = errors.New("NATS refused this identity's subscription to its reply inbox")
	// ErrVerbRefused: NATS refused the publish of the request; the
	// identity's permissions do not grant its subject (a verb, or $SRV for
	// discovery).
	ErrVerbRefused = errors.New("NATS refused this identity's request on")
)

// violations collects the permission violations NATS reports on a client
// command's connection, and says once one was seen, so that a request
// waiting for an answer that cannot come ends at once.
type violations struct {
	inbox string // the connection's inbox prefix; empty for nats.go's _INBOX

	mu   sync.Mutex
	seen []string
	once sync.Once
	hit  chan struct{}
}

func newViolations(inbox string) *violations {
	return &violations{inbox: inbox, hit: make(chan struct{})}
}

// record is the connection's handler of permission violations.
func (v *violations) record(err error) {
	v.mu.Lock()
	v.seen = append(v.seen, err.Error())
	v.mu.Unlock()
	v.once.Do(func() { close(v.hit) })
}

// violationSubject finds the subject in nats.go's violation text:
// `nats: permissions violation: Permissions Violation for Subscription to "_INBOX.x.*"`.
var violationSubject = regexp.MustCompile(`for (Subscription|Publish) to "([^"]+)"`)

// whileWatching returns a context that ends, besides with ctx, as soon as
// a permission violation is reported: the request it bounds fails fast
// instead of waiting out its timeout for an answer NATS will not deliver.
func (v *violations) whileWatching(ctx context.Context) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-v.hit:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// explain returns err, or, when a permission violation explains why the
// request failed, an error that says which and what to do.
func (v *violations) explain(err error) error {
	if err == nil {
		return nil
	}
	if _, answered := errors.AsType[*wire.Error](err); answered {
		return err // the service answered: NATS let the request through
	}
	v.mu.Lock()
	seen := append([]string{}, v.seen...)
	v.mu.Unlock()
	// A refused inbox explains everything after it: no answer can arrive.
	subscriptionFirst := func(text string) int {
		if strings.Contains(text, "for Subscription") {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(seen, func(a, b string) int { return cmp.Compare(subscriptionFirst(a), subscriptionFirst(b)) })
	for _, text := range seen {
		m := violationSubject.FindStringSubmatch(text)
		if m == nil {
			continue
		}
		verb, subject := m[1], m[2]
		switch {
		case verb == "Subscription" && (strings.HasPrefix(subject, "_INBOX") || v.inbox != "" && strings.HasPrefix(subject, v.inbox+".")):
			given := "nats.go's default, as no --inbox-prefix was given"
			if v.inbox != "" {
				given = "its permissions do not grant --inbox-prefix " + v.inbox
			}
			return fmt.Errorf("%w %s (%s); connect with the identity's context (--context: mesh-provisioner init writes one that names its prefix) or with the --inbox-prefix its permissions grant: %s for a node, %s for a provider, %s for an operator",
				ErrInboxRefused, subject, given, wire.InboxPrefix(wire.RoleNode, "<node>"), wire.InboxPrefix(wire.RoleProvider, "<module>"), wire.InboxPrefix(wire.RoleOperator, "<name>"))
		case verb == "Publish" && (subject == wire.ProvisioningSubject || subject == wire.ComposeSubject):
			return fmt.Errorf("%w %s: its permissions do not grant the verb (mesh-provisioner permissions --node <node> prints a set that does)", ErrVerbRefused, subject)
		case verb == "Publish":
			return fmt.Errorf("%w %s: its permissions do not grant it; use an identity that may", ErrVerbRefused, subject)
		}
	}
	return err
}

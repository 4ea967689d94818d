package meshstatus

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats.go"
)

// RefusedError says NATS refused what Gather asked on the connection: its
// identity may not read the mesh. Gather returns it, with
// Options.FailOnRefusal, as soon as nats.go reports the refusal, rather than
// once its requests time out.
type RefusedError struct {
	// Verb is "Subscription" (a reply inbox the identity may not subscribe
	// to) or "Publish" (a subject it may not ask on).
	Verb string
	// Subject is the subject refused, such as _INBOX.abc or
	// $SRV.STATS.mesh-provisioner.
	Subject string
	// Err is nats.go's error, which wraps nats.ErrPermissionViolation.
	Err error
}

func (e *RefusedError) Error() string {
	if e.Subject == "" {
		return "NATS refused this identity: " + e.Err.Error()
	}
	return fmt.Sprintf("NATS refused this identity's %s to %q", e.what(), e.Subject)
}

// what names the refused act in a sentence.
func (e *RefusedError) what() string {
	if e.Verb == "Subscription" {
		return "subscription"
	}
	return "publish"
}

func (e *RefusedError) Unwrap() error { return e.Err }

// refusedText finds the act and the subject in nats.go's text of a
// violation: `nats: permissions violation: Permissions Violation for
// Subscription to "_INBOX.x"`.
var refusedText = regexp.MustCompile(`for (Subscription|Publish) to "([^"]+)"`)

// refusedOf returns err as a RefusedError when it is a permission violation.
func refusedOf(err error) *RefusedError {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return nil
	}
	r := &RefusedError{Err: err}
	if m := refusedText.FindStringSubmatch(err.Error()); m != nil {
		r.Verb, r.Subject = m[1], m[2]
	}
	return r
}

// refusalPoll is how often a watch looks at the connection's last error.
const refusalPoll = 20 * time.Millisecond

// refusalWatch ends a Gather as soon as NATS refuses the connection anything
// after it began: nats.go keeps the last violation as the connection's last
// error, each a new error. Only the connection's owner could hear them
// through its error handler, which Gather cannot set.
type refusalWatch struct {
	nc     *nats.Conn
	before error
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// watchRefusals returns a context that ends, besides with ctx, when NATS
// refuses nc anything, its cause the RefusedError; stop ends the watch.
func watchRefusals(ctx context.Context, nc *nats.Conn) (context.Context, *refusalWatch) {
	ctx, cancel := context.WithCancelCause(ctx)
	w := &refusalWatch{nc: nc, before: nc.LastError(), cancel: cancel, done: make(chan struct{})}
	go func() {
		tick := time.NewTicker(refusalPoll)
		defer tick.Stop()
		for {
			select {
			case <-w.done:
				return
			case <-ctx.Done():
				return
			case <-tick.C:
				if r := w.refused(); r != nil {
					cancel(r)
					return
				}
			}
		}
	}()
	return ctx, w
}

// refused returns the violation NATS reported since the watch began, if
// any.
func (w *refusalWatch) refused() *RefusedError {
	err := w.nc.LastError()
	if err == nil || err == w.before { //nolint:errorlint // the same error value: nothing new was reported
		return nil
	}
	return refusedOf(err)
}

// check returns a violation NATS reported for what nc sent before it:
// a round trip to the server, which answers a refused subscription or
// publish before it answers the flush.
func (w *refusalWatch) check(ctx context.Context) error {
	fctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := w.nc.FlushWithContext(fctx); err != nil {
		return w.explain(err)
	}
	if r := w.refused(); r != nil {
		return r
	}
	return nil
}

// explain returns the refusal that ended the watch's context, if one did,
// else err.
func (w *refusalWatch) explain(err error) error {
	if err == nil {
		return nil
	}
	if r := w.refused(); r != nil {
		return r
	}
	return err
}

// stop ends the watch.
func (w *refusalWatch) stop() {
	close(w.done)
	w.cancel(nil)
}

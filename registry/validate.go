package registry

import (
	"errors"
	"fmt"
	"regexp"
	"strings"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/keyshape"
)

// SecretKinds are the kinds whose values are secrets: they must be answered
// by a verb, never from a bucket.
var SecretKinds = []string{"secret", "consumers"}

var (
	bucketName = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)
	subject    = regexp.MustCompile(`^[^.*>\s]+(\.[^.*>\s]+)*$`)
)

// Validate checks a registry table: every entry names a kind that is a key
// token, an owner, a description and exactly one source; bucket sources have
// a valid bucket name (after "<provider>") and a key shape that parses (one
// that begins with <node> if the bucket is each provider's); verb
// sources have a seat and a literal subject; no secret kind has a bucket
// source; no kind stands twice. It returns every problem at once, joined, each
// wrapping ErrInvalidTable.
func Validate(table []*provisionerv1.RegistryEntry) error {
	var errs []error
	fail := func(i int, kind, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: entry %d (%q): %s", ErrInvalidTable, i, kind, fmt.Sprintf(format, args...)))
	}
	seen := map[string]int{}
	for i, e := range table {
		if e == nil {
			fail(i, "", "is nil")
			continue
		}
		if err := keys.CheckToken(e.GetKind()); err != nil {
			fail(i, e.GetKind(), "kind %v", err)
		}
		if first, dup := seen[e.GetKind()]; dup {
			fail(i, e.GetKind(), "the kind is answered already by entry %d", first)
		}
		seen[e.GetKind()] = i
		if e.GetOwner() == "" {
			fail(i, e.GetKind(), "has no owner")
		}
		if e.GetDescription() == "" {
			fail(i, e.GetKind(), "has no description")
		}
		switch src := e.GetSource().(type) {
		case *provisionerv1.RegistryEntry_Bucket:
			if src.Bucket == nil {
				fail(i, e.GetKind(), "has an empty bucket source")
				break
			}
			for _, secret := range SecretKinds {
				if e.GetKind() == secret {
					fail(i, e.GetKind(), "is a secret kind with a bucket source; a secret is never in a bucket, answer it with a verb")
				}
			}
			if name := strings.ReplaceAll(src.Bucket.GetBucket(), "<provider>", "p"); !bucketName.MatchString(name) {
				fail(i, e.GetKind(), "bucket %q is not a bucket name (A-Z a-z 0-9 - _, and <provider>)", src.Bucket.GetBucket())
			}
			shape, err := keyshape.Parse(src.Bucket.GetKeyShape())
			if err != nil {
				fail(i, e.GetKind(), "%v", err)
				break
			}
			if err := checkCollection(shape, src.Bucket.GetCollection()); err != nil {
				fail(i, e.GetKind(), "%v", err)
			}
			if strings.Contains(src.Bucket.GetBucket(), keyshape.ProviderOwner) && !shape.LeadsWith("node") {
				fail(i, e.GetKind(), "key shape %s of a bucket each provider keeps must begin with <node>: a node's answers follow the providers' keys by their first token", shape)
			}
		case *provisionerv1.RegistryEntry_Verb:
			if src.Verb == nil {
				fail(i, e.GetKind(), "has an empty verb source")
				break
			}
			if src.Verb.GetSeat() == "" {
				fail(i, e.GetKind(), "verb source has no seat")
			}
			if !subject.MatchString(src.Verb.GetSubject()) {
				fail(i, e.GetKind(), "verb subject %q is not a literal NATS subject", src.Verb.GetSubject())
			}
		default:
			fail(i, e.GetKind(), "has no source; give a bucket source or a verb source")
		}
	}
	return errors.Join(errs...)
}

// checkCollection checks that a bucket source names a collection exactly when
// its key shape holds <collection>, with a template of <kind> and <name> only.
func checkCollection(shape keyshape.Shape, template string) error {
	if has := shape.Has("collection"); has != (template != "") {
		if has {
			return fmt.Errorf("key shape %s holds <collection> but the source names no collection template", shape)
		}
		return fmt.Errorf("collection template %q needs a key shape with <collection>", template)
	}
	if template == "" {
		return nil
	}
	if !shape.Has("contributor") {
		return fmt.Errorf("key shape %s of a collection needs <contributor>", shape)
	}
	rest := strings.NewReplacer("<kind>", "", "<name>", "").Replace(template)
	if strings.ContainsAny(rest, "<>") {
		return fmt.Errorf("collection template %q may use only <kind> and <name>", template)
	}
	return nil
}

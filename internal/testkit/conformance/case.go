// Package conformance reads the cases of the conformance suite (the folder
// conformance/cases at the repository's root) and applies a case's bucket
// writes to a running mesh-provisioner. The Go runner (conformance_test.go)
// and the apply command (internal/testkit/conformance/apply), which the TypeScript and
// Python runners call, share it, so that every language writes a case's
// buckets the same way. conformance/README.md describes the case format.
//
// It speaks NATS and JetStream directly, with the generated types of gen/
// and the bucket names of package keys, and depends on no client package of
// this repository.
package conformance

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
	"github.com/novox/mesh-provisioner/wire"
)

// ServeArgs are the flags every runner starts the binary with, after
// --state-dir: a free port, JSON logs (the runner waits for the "serving"
// record and reads nats_url from it) and a short revision wait, so that a
// case expecting a 503 for a revision never reached takes one second.
var ServeArgs = []string{"--listen", "127.0.0.1:0", "--log-format", "json", "--revision-wait", "1s"}

// Case is one file of the suite. Only the writes are read here; runners read
// the request and the expectation themselves, each in its own language.
type Case struct {
	// Name is the file's name without .json.
	Name string `json:"-"`
	// About says what the case pins, in a sentence.
	About string `json:"about"`
	// Pending, when set, says what the server still lacks for the case to
	// pass: runners skip it, saying so, unless CONFORMANCE_RUN_PENDING is set.
	Pending string `json:"pending"`
	// Writes are applied in order to a fresh server before the request.
	Writes []Write `json:"writes"`
	// NoWait leaves the server's copy to catch up on its own: the request's
	// min_revision makes the server wait for the writes (read your writes).
	NoWait bool `json:"no_wait"`
	// Verb is "provisioning", "compose" or "provisions", or a write verb:
	// "put", "delete", "apply", "declare" or "bind".
	Verb string `json:"verb"`
	// Address, when set, sends the request to the verb's addressed subject
	// "mesh-provisioner.<verb>.<address>": a node's (provisioning,
	// compose) or a provider's (provisions, which is only addressed).
	Address string `json:"address"`
	// Request is the request as protobuf JSON, sent once in binary and once
	// in JSON.
	Request json.RawMessage `json:"request"`
	// Body is a raw body sent as is, instead of Request.
	Body *Body `json:"body"`
	// Reply, with Body, is a reply subject that is not the asker's inbox:
	// the body is first sent with it, and the runner listening there must
	// hear nothing; then the body is sent as usual and gets Expect, whose
	// revision shows whether the first was stored.
	Reply string `json:"reply"`
	// ServerArgs are flags added after ServeArgs, for a case that needs a
	// limit of its own (--node-max-keys 1).
	ServerArgs []string `json:"server_args"`
	// Expect is the answer, the pages or the error.
	Expect Expect `json:"expect"`
	// Then is a request sent after the first page, with its token.
	Then *Then `json:"then"`
}

// Write is a put (Value or Raw) or a delete of one key.
type Write struct {
	Bucket string `json:"bucket"`
	// Key is the key as stored, escapes included.
	Key string `json:"key"`
	// Value is protobuf JSON of the bucket's message.
	Value json.RawMessage `json:"value"`
	// Raw is the value's bytes in base64, for values that do not decode.
	Raw *string `json:"raw"`
	// Delete deletes the key.
	Delete bool `json:"delete"`
}

// Body is a request body sent as is.
type Body struct {
	// Text is the body as UTF-8 text.
	Text *string `json:"text"`
	// Base64 is the body's bytes in base64.
	Base64 *string `json:"base64"`
	// ContentType, when set, is sent as the header Content-Type.
	ContentType string `json:"content_type"`
}

// Expect is what a request must get: exactly one of Answer, Pages and Error.
type Expect struct {
	Answer json.RawMessage   `json:"answer"`
	Pages  []json.RawMessage `json:"pages"`
	Error  *ExpectedError    `json:"error"`
	// ContentType is the answer's Content-Type, checked for a raw body.
	ContentType string `json:"content_type"`
}

// ExpectedError is a refusal: its code, and its sentence exactly or its
// beginning.
type ExpectedError struct {
	Code           int    `json:"code"`
	Sentence       string `json:"sentence"`
	SentencePrefix string `json:"sentence_prefix"`
}

// Then is a second request, sent with the first page's next_page_token.
type Then struct {
	Request json.RawMessage `json:"request"`
	Expect  Expect          `json:"expect"`
}

// Load reads every case of dir, in file name order.
func Load(dir string) ([]Case, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.json"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no cases in %s", dir)
	}
	slices.Sort(files)
	cases := make([]Case, 0, len(files))
	for _, file := range files {
		c, err := LoadFile(file)
		if err != nil {
			return nil, err
		}
		cases = append(cases, c)
	}
	return cases, nil
}

// LoadFile reads one case.
func LoadFile(file string) (Case, error) {
	data, err := os.ReadFile(file)
	if err != nil {
		return Case{}, err
	}
	var c Case
	dec := json.NewDecoder(strings.NewReader(string(data)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return Case{}, fmt.Errorf("%s: %w", file, err)
	}
	c.Name = strings.TrimSuffix(filepath.Base(file), ".json")
	if c.Reply != "" && c.Body == nil {
		return Case{}, fmt.Errorf("%s: reply goes with body, which is sent once", file)
	}
	return c, nil
}

// valueOf returns the message type a bucket's values hold.
func valueOf(bucket string) (proto.Message, error) {
	switch bucket {
	case keys.RegistryBucket:
		return &provisionerv1.RegistryEntry{}, nil
	case keys.NeedsBucket:
		return &provisionerv1.Need{}, nil
	case keys.AppliedBucket:
		return &provisionerv1.Applied{}, nil
	case keys.CollectBucket:
		return &provisionerv1.CollectItem{}, nil
	case keys.ManifestsBucket:
		return &provisionerv1.Manifest{}, nil
	}
	if isProviderBucket(bucket) {
		return nil, nil // a provider's own values: raw, or none
	}
	return nil, fmt.Errorf("bucket %q is neither one of the five provisioning buckets nor a provider's (<provider>_bound)", bucket)
}

// isProviderBucket reports whether bucket is a provider's, <provider>_bound.
func isProviderBucket(bucket string) bool {
	provider, ok := strings.CutSuffix(bucket, "_bound")
	return ok && keys.CheckToken(provider) == nil && !strings.HasPrefix(bucket, wire.ServiceName)
}

// whatOf names the answer that reads each bucket.
var whatOf = map[string]provisionerv1.What{
	keys.RegistryBucket:  provisionerv1.What_WHAT_REGISTRY,
	keys.NeedsBucket:     provisionerv1.What_WHAT_NEEDS,
	keys.AppliedBucket:   provisionerv1.What_WHAT_APPLIED,
	keys.CollectBucket:   provisionerv1.What_WHAT_COLLECT,
	keys.ManifestsBucket: provisionerv1.What_WHAT_MANIFESTS,
}

// Bytes returns the value a write puts.
func (w Write) Bytes() ([]byte, error) {
	if w.Raw != nil {
		return base64.StdEncoding.DecodeString(*w.Raw)
	}
	m, err := valueOf(w.Bucket)
	if err != nil {
		return nil, err
	}
	if m == nil {
		if len(w.Value) > 0 {
			return nil, fmt.Errorf("value of %s in %s: a provider's bucket takes raw values only", w.Key, w.Bucket)
		}
		return nil, nil
	}
	if len(w.Value) > 0 {
		if err := protojson.Unmarshal(w.Value, m); err != nil {
			return nil, fmt.Errorf("value of %s in %s: %w", w.Key, w.Bucket, err)
		}
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

// Apply writes a case's writes in order and returns the last revision written
// to each bucket. Unless the case says no_wait, it then waits until the
// server's copy holds them, so that a request without min_revision sees them.
func Apply(ctx context.Context, nc *nats.Conn, c Case) (map[string]uint64, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	last := map[string]uint64{}
	kvs := map[string]jetstream.KeyValue{}
	for _, w := range c.Writes {
		kv, ok := kvs[w.Bucket]
		if !ok {
			if _, err := valueOf(w.Bucket); err != nil {
				return nil, err
			}
			if isProviderBucket(w.Bucket) {
				// A provider makes its own bucket; the case stands in for it.
				kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: w.Bucket})
			} else {
				kv, err = js.KeyValue(ctx, w.Bucket)
			}
			if err != nil {
				return nil, fmt.Errorf("bind bucket %s: %w", w.Bucket, err)
			}
			kvs[w.Bucket] = kv
		}
		if w.Delete {
			if err := kv.Delete(ctx, w.Key); err != nil {
				return nil, fmt.Errorf("delete %s in %s: %w", w.Key, w.Bucket, err)
			}
			// A delete is a write: the bucket's revision moves past it.
			stream, err := js.Stream(ctx, wire.StreamOf(w.Bucket))
			if err != nil {
				return nil, err
			}
			info, err := stream.Info(ctx)
			if err != nil {
				return nil, err
			}
			last[w.Bucket] = info.State.LastSeq
			continue
		}
		value, err := w.Bytes()
		if err != nil {
			return nil, err
		}
		rev, err := kv.Put(ctx, w.Key, value)
		if err != nil {
			return nil, fmt.Errorf("put %s in %s: %w", w.Key, w.Bucket, err)
		}
		last[w.Bucket] = rev
	}
	if !c.NoWait {
		if err := WaitForCopy(ctx, nc, last, c.nodes()); err != nil {
			return nil, err
		}
	}
	return last, nil
}

// nodes returns the nodes the case writes needs of, sorted.
func (c Case) nodes() []string {
	var nodes []string
	for _, w := range c.Writes {
		if node, _, _ := strings.Cut(w.Key, "."); w.Bucket == keys.NeedsBucket && !slices.Contains(nodes, node) {
			nodes = append(nodes, node)
		}
	}
	slices.Sort(nodes)
	return nodes
}

// WaitForCopy asks the provisioning verb, bucket by bucket, to answer at the
// last revision written to it, until it does: a 503 (still loading, or the
// revision not reached within the server's wait) is asked again. A
// provider's bucket is asked through the compose verb, of each of nodes:
// the server waits for a provider's bucket only in the compositions of the
// nodes whose needs name it (docs/protocol.md), and follows it from then.
func WaitForCopy(ctx context.Context, nc *nats.Conn, last map[string]uint64, nodes []string) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for bucket, rev := range last {
		if !isProviderBucket(bucket) {
			if err := waitFor(ctx, nc, wire.ProvisioningSubject, &provisionerv1.ProvisioningRequest{What: whatOf[bucket], MinRevision: rev}, bucket, rev); err != nil {
				return err
			}
			continue
		}
		for _, node := range nodes {
			req := &provisionerv1.ComposeRequest{Node: node, MinRevisions: &provisionerv1.Revisions{Bound: map[string]uint64{bucket: rev}}}
			if err := waitFor(ctx, nc, wire.ComposeSubject, req, bucket, rev); err != nil {
				return err
			}
		}
	}
	return nil
}

// waitFor asks req on subject until it is answered, not refused: a 503 is
// asked again.
func waitFor(ctx context.Context, nc *nats.Conn, subject string, req proto.Message, bucket string, rev uint64) error {
	body, err := proto.Marshal(req)
	if err != nil {
		return err
	}
	for {
		msg := nats.NewMsg(subject)
		msg.Data = body
		msg.Header.Set("Content-Type", "application/protobuf")
		reply, err := nc.RequestMsgWithContext(ctx, msg)
		if err == nil && reply.Header.Get(micro.ErrorCodeHeader) == "" {
			return nil
		}
		if err == nil {
			code, _ := strconv.Atoi(reply.Header.Get(micro.ErrorCodeHeader))
			err = fmt.Errorf("%d: %s", code, reply.Header.Get(micro.ErrorHeader))
			if code != 503 {
				return fmt.Errorf("ask for %s at revision %d: %w", bucket, rev, err)
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("the server's copy of %s did not reach revision %d: %w", bucket, rev, errors.Join(err, ctx.Err()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Asker is the identity an addressed case asks as, whose inbox the service
// answers it on: the provider for provisions and bind, else the node (the
// address's first token). An unaddressed case asks as no one ("").
func (c Case) Asker() (wire.Role, string) {
	if c.Address == "" {
		return "", ""
	}
	if c.Verb == "provisions" || c.Verb == "bind" {
		return wire.RoleProvider, c.Address
	}
	node, _, _ := strings.Cut(c.Address, ".")
	return wire.RoleNode, node
}

// Subject returns the subject a case's request is sent to.
func (c Case) Subject() string {
	subject := "mesh-provisioner." + c.Verb
	if c.Address != "" {
		subject += "." + c.Address
	}
	return subject
}

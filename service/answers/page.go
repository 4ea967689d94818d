package answers

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/wire"
)

// pageToken is what a next_page_token carries: which request it continues,
// the last key the previous page held, and the revisions that page read, so
// that the next page, whichever instance answers it, is read from a copy at
// least as new.
//
// A token grants nothing a request could not ask for itself, so it is not
// signed with a secret (instances would have to share one): a checksum
// refuses a token that was damaged or edited, and the request digest one
// sent with other filters.
type pageToken struct {
	Request   string   `json:"q"`
	After     string   `json:"a"`
	Revisions []uint64 `json:"r"`
	// Partition is the partition a walk of every node is in, on a mesh
	// whose instances hold some partitions each (partitions); After is a
	// key of it. Walk says the token is such a walk's: an instance that
	// walks the other way refuses it (sameWalk).
	Partition int  `json:"p,omitempty"`
	Walk      bool `json:"w,omitempty"`
}

// sameWalk refuses a token of a walk of every node made the other way: by
// partition where this instance walks the whole mesh in key order, or the
// other way round. Its After would be read as the other's, and records
// skipped or repeated.
func sameWalk(text string, t pageToken, ps partitions) *wire.Error {
	if text == "" || t.Walk == ps.partial() {
		return nil
	}
	return wire.NewError(wire.CodeBadRequest, "page_token was issued by an instance that walks the mesh otherwise (partition by partition, serve --hold, or in key order); the instances of a mesh serve some partitions each or all the whole mesh: leave page_token out to start again")
}

// tokenVersion starts every checksum: a later format changes it, and an old
// server then refuses a new token as unreadable rather than misreading it.
const tokenVersion = "mesh-provisioner page token v1\x00"

// checksumLen is how many bytes of SHA-256 a token carries.
const checksumLen = 8

func checksum(payload []byte) []byte {
	sum := sha256.Sum256(append([]byte(tokenVersion), payload...))
	return sum[:checksumLen]
}

func (t pageToken) encode() string {
	payload, _ := json.Marshal(t) // strings and numbers: it cannot fail
	return base64.RawURLEncoding.EncodeToString(append(payload, checksum(payload)...))
}

// errBadToken is wrapped by every reason a token is refused.
var errBadToken = errors.New("bad page token")

func decodeToken(text string) (pageToken, error) {
	raw, err := base64.RawURLEncoding.DecodeString(text)
	if err != nil || len(raw) <= checksumLen {
		return pageToken{}, fmt.Errorf("%w: it is not a token this service issued", errBadToken)
	}
	payload, sum := raw[:len(raw)-checksumLen], raw[len(raw)-checksumLen:]
	if !bytes.Equal(sum, checksum(payload)) {
		return pageToken{}, fmt.Errorf("%w: its checksum does not match; it was changed or cut", errBadToken)
	}
	var t pageToken
	if err := json.Unmarshal(payload, &t); err != nil {
		return pageToken{}, fmt.Errorf("%w: it does not decode", errBadToken)
	}
	return t, nil
}

// requestDigest identifies a request by everything but its paging and its
// minimum revisions: a token continues only the request it was issued for.
func requestDigest(req proto.Message) string {
	b, _ := deterministic.Marshal(req)
	sum := sha256.Sum256(b)
	return base64.RawURLEncoding.EncodeToString(sum[:12])
}

// readToken decodes a request's page token and checks that it continues
// the request whose digest digestOf returns; an empty token is the first
// page. The digest is made only for a token: it encodes and hashes the
// request, and most requests, a flood's too, carry none.
func readToken(text string, digestOf func() string) (pageToken, *wire.Error) {
	if text == "" {
		return pageToken{}, nil
	}
	t, err := decodeToken(text)
	if err != nil {
		return pageToken{}, wire.Errorf(wire.CodeBadRequest, "page_token refused (%v); send the next_page_token of the previous page as it came, or leave page_token out to start again", err)
	}
	if t.Request != digestOf() {
		return pageToken{}, wire.NewError(wire.CodeBadRequest, "page_token was issued for another request; send it with the same what, filters, node and module as the first page, or leave it out to start again")
	}
	return t, nil
}

// A Budget is what a page's encoded items may take: it is filled up to
// Fill bytes, and a first item larger than that is still sent alone, up to
// Most (what one message carries beside its headers). An answer kept
// below what NATS carries keeps the service's buffers small: the page
// kept in the answer cache, and the connection's write buffer, which
// nats.go keeps at the largest message's size.
type Budget struct{ Fill, Most int }

// page fills an answer with items while they fit: at most size items (zero:
// any number), and at most budget bytes once encoded, or most for a first
// item alone. Each item's size is measured as it is added, in the answer's
// encoding, so no answer is ever built whole only to be refused.
type page struct {
	enc    Encoding
	size   int
	budget int
	most   int
	used   int
	count  int
	// full says an item did not fit: the page ends there.
	full bool
}

// fits reports whether an item of n encoded bytes may join the page, and
// counts it in if so. The first item always fits the count; a first item
// larger than most does not fit.
func (p *page) fits(n int) bool {
	if p.size > 0 && p.count >= p.size {
		p.full = true
		return false
	}
	// A repeated field's element costs its bytes, a tag and a length in
	// binary (at most 1+5), or a comma in JSON.
	n += 6
	if !p.takes(n, 1) {
		p.full = true
		return false
	}
	p.used += n
	p.count++
	return true
}

// takes reports whether items more, of n bytes, fit the page: within its
// budget, or within most for a first item alone.
func (p *page) takes(n, items int) bool {
	return p.used+n <= p.budget || items == 1 && p.count == 0 && p.used+n <= p.most
}

// sizeOf returns the encoded size of a message in the page's encoding; zero
// for a replayed answer, which is never sent.
func (p *page) sizeOf(m proto.Message) int {
	if p.budget >= unpaged.Fill {
		return 0
	}
	if p.enc.json {
		b, err := marshalJSON(m)
		if err != nil {
			return p.most + 1 // unencodable: never fits; send reports it
		}
		return len(b)
	}
	if c, ok := m.(*provisionerv1.ComposeResponse); ok {
		return sizeCompose(c)
	}
	return proto.Size(m)
}

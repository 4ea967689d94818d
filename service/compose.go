package service

import (
	"bytes"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/nats-io/nats.go/micro"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/novox/mesh-provisioner/compose"
	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/keys"
)

// handleCompose answers mesh-provisioner.compose.
func (s *Service) handleCompose(req micro.Request) {
	var in provisionerv1.ComposeRequest
	s.handle(req, s.counters[ComposeEndpoint], &in,
		func() *codedError { return checkCompose(&in) },
		func() []revisionWait {
			min := in.GetMinRevisions()
			return []revisionWait{
				{s.mirror.registry, min.GetRegistry()},
				{s.mirror.needs, min.GetNeeds()},
				{s.mirror.applied, min.GetApplied()},
				{s.mirror.collect, min.GetCollect()},
			}
		},
		func(waited time.Duration) proto.Message { return s.compose(&in, waited) })
}

func checkCompose(in *provisionerv1.ComposeRequest) *codedError {
	if in.GetNode() == "" {
		return badRequest("node is required: the node to compose")
	}
	if err := keys.CheckToken(in.GetNode()); err != nil {
		return badRequest(fmt.Sprintf("node %q can match no key: it %v", in.GetNode(), err))
	}
	if in.GetModule() != "" {
		if err := keys.CheckToken(in.GetModule()); err != nil {
			return badRequest(fmt.Sprintf("module %q can match no key: it %v", in.GetModule(), err))
		}
	}
	return nil
}

// compose composes a node from the copy, and logs it if it was slow.
func (s *Service) compose(in *provisionerv1.ComposeRequest, waited time.Duration) *provisionerv1.ComposeResponse {
	start := time.Now()
	out, input := s.mirror.compose(in, waited, true)
	took := waited + time.Since(start)
	slow := took > s.slowCompose
	unchanged := false
	// Only compositions that hold something are remembered: a request for a
	// node or module the mesh does not have must not grow the memory.
	if len(out.GetPlans())+len(out.GetRefusals()) > 0 {
		unchanged = s.compositions.remember(in.GetNode()+"\x00"+in.GetModule(), input, out, slow)
	}
	if slow {
		attrs := []any{"node", in.GetNode(), "module", in.GetModule(), "took", took, "phases", phasesLog(out.GetPhases())}
		if unchanged {
			s.logger.Warn("slow composition; it changed nothing since the node's previous one", attrs...)
		} else {
			s.logger.Warn("slow composition", attrs...)
		}
	}
	return out
}

// compose composes a node from the copy. With reuse, needs that neither
// changed nor had their registry entry change since the node's last
// composition are not resolved again. It returns what the composition read,
// to tell whether a later one read the same.
func (m *mirror) compose(in *provisionerv1.ComposeRequest, waited time.Duration, reuse bool) (*provisionerv1.ComposeResponse, composeInput) {
	start := time.Now()
	needs, needsChanged, needsRevision := m.needs.groupOf(in.GetNode())
	items, itemsChanged, collectRevision := m.collect.groupOf(in.GetNode())
	malformed := make([]*provisionerv1.MalformedKey, len(needs.malformed))
	for i, h := range needs.malformed {
		malformed[i] = h.malformed
	}
	revisions := &provisionerv1.Revisions{
		Registry: m.registry.at(),
		Needs:    needsRevision,
		Applied:  m.applied.at(),
		Collect:  collectRevision,
	}
	read := time.Since(start)
	input := compose.Input{
		Node:      in.GetNode(),
		Module:    in.GetModule(),
		Registry:  m.registryEntry,
		Needs:     needs.records,
		Malformed: malformed,
		Items:     items.records,
		Revisions: revisions,
	}
	if reuse {
		input.Memo = needs.memo.Load()
	}
	out, memo := compose.Compose(input)
	if reuse && memo != nil && memo != input.Memo {
		needs.memo.Store(memo)
	}
	out.Phases = append([]*provisionerv1.Phase{
		{Name: "wait", Duration: durationpb.New(waited)},
		{Name: "read", Duration: durationpb.New(read)},
	}, out.Phases...)
	return out, composeInput{registry: revisions.GetRegistry(), needs: needsChanged, collect: itemsChanged}
}

func phasesLog(phases []*provisionerv1.Phase) slog.Value {
	attrs := make([]slog.Attr, len(phases))
	for i, p := range phases {
		attrs[i] = slog.Duration(p.GetName(), p.GetDuration().AsDuration())
	}
	return slog.GroupValue(attrs...)
}

// composeInput identifies what a composition read: the registry's revision
// and the revisions of the last change to the node's needs and items. Equal
// inputs give equal compositions.
type composeInput struct{ registry, needs, collect uint64 }

// compositions remembers, per node and module, what the previous composition
// read and, when it was slow, a digest of its result.
type compositions struct {
	mu   sync.Mutex
	last map[string]composition
}

type composition struct {
	input  composeInput
	digest []byte // nil unless the composition was slow
}

// remember records a composition and reports whether it is identical to the
// previous one of the same node and module. It computes a digest of the
// result only for a slow composition, the one whose log says so.
func (c *compositions) remember(key string, input composeInput, out *provisionerv1.ComposeResponse, slow bool) (unchanged bool) {
	var digest []byte
	if slow {
		digest = digestOf(out)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.last == nil {
		c.last = map[string]composition{}
	}
	prev, ok := c.last[key]
	unchanged = ok && (prev.input == input || (prev.digest != nil && bytes.Equal(prev.digest, digest)))
	c.last[key] = composition{input: input, digest: digest}
	return unchanged
}

// digestOf hashes a composition without its phases and revisions, which
// differ between identical results.
func digestOf(out *provisionerv1.ComposeResponse) []byte {
	bare := &provisionerv1.ComposeResponse{Node: out.GetNode(), Module: out.GetModule(), Plans: out.GetPlans(), Provisions: out.GetProvisions(), Refusals: out.GetRefusals()}
	b, err := proto.MarshalOptions{Deterministic: true}.Marshal(bare)
	if err != nil {
		return nil
	}
	sum := sha256.Sum256(b)
	return sum[:]
}

package answers

import (
	"fmt"

	provisionerv1 "github.com/novox/mesh-provisioner/gen/mesh/provisioner/v1"
	"github.com/novox/mesh-provisioner/internal/mirror"
)

// Replay answers the verbs from a capture, as the live service would at the
// captured revisions, without NATS: for tests, benchmarks and looking into a
// captured mesh.
type Replay struct {
	mirror *mirror.Mirror
}

// NewReplay loads a capture. A bucket the capture lacks is empty.
func NewReplay(capture *provisionerv1.Capture) (*Replay, error) {
	m, err := mirror.Load(capture)
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	return &Replay{mirror: m}, nil
}

// unpaged is the budget of a replayed answer: it is not sent, so one page
// holds everything.
var unpaged = Budget{Fill: 1 << 62, Most: 1 << 62}

// Compose composes a node as the compose verb would, in one page; it does
// not check the request, nor wait for revisions. It fails as the verb would
// on a page_token it cannot read, with the verb's error (code 400).
func (r *Replay) Compose(in *provisionerv1.ComposeRequest) (*provisionerv1.ComposeResponse, error) {
	out, t, werr := composeFrom(r.mirror, in, Encoding{}, unpaged, reading{views: keepViews})
	if werr != nil {
		return nil, werr
	}
	t.built = true
	needs, _, _ := r.mirror.Needs.Group(in.GetNode())
	out.Revisions, out.Phases = r.mirror.RevisionsNow().Only(namedBuckets(r.mirror, needs)).Proto(), phasesOf(t)
	return out, nil
}

// Provisioning answers as the provisioning verb would, in one page; it does
// not check the request, nor wait for revisions. It fails as the verb would
// on a page_token it cannot read, with the verb's error (code 400).
func (r *Replay) Provisioning(in *provisionerv1.ProvisioningRequest) (*provisionerv1.ProvisioningResponse, error) {
	out, werr := provisioningFrom(r.mirror, partitions{}, in, Encoding{}, unpaged)
	if werr != nil {
		return nil, werr
	}
	out.Revision = copyOf(r.mirror, WhatOf(in)).Revision()
	return out, nil
}

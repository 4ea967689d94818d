package main

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image make image writes holds a binary that runs: the test builds
// the command as make image does, writes the image, reads the tarball back
// as docker load would, and runs the binary it finds in the layer.
func TestImageHoldsTheServiceThatRuns(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	binary := filepath.Join(dir, "mesh-provisioner")
	build := exec.CommandContext(t.Context(), "go", "build", "-trimpath", "-o", binary, "github.com/novox/mesh-provisioner/cmd/mesh-provisioner")
	build.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+runtime.GOARCH)
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	out := filepath.Join(dir, "image.tar")
	cfg := config{binary: binary, tag: "mesh-provisioner:test", out: out, layout: filepath.Join(dir, "layout"), arch: runtime.GOARCH, version: "1.2.3"}
	if err := cfg.write(); err != nil {
		t.Fatal(err)
	}

	tag, _ := name.NewTag(cfg.tag)
	if _, err := tarball.ImageFromPath(out, &tag); err != nil {
		t.Fatalf("the tarball does not load as an image: %v", err)
	}
	index, err := layout.ImageIndexFromPath(cfg.layout)
	if err != nil {
		t.Fatalf("the OCI layout does not read: %v", err)
	}
	manifest, err := index.IndexManifest()
	if err != nil || len(manifest.Manifests) != 1 {
		t.Fatalf("the OCI layout's index: %v, %v; want one image", manifest, err)
	}
	img, err := index.Image(manifest.Manifests[0].Digest)
	if err != nil {
		t.Fatal(err)
	}
	if mt, err := img.MediaType(); err != nil || mt != types.OCIManifestSchema1 {
		t.Errorf("manifest media type %q (%v), want %q", mt, err, types.OCIManifestSchema1)
	}
	file, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	if got := file.Config; !slices.Equal(got.Entrypoint, []string{"/" + binaryPath}) || !slices.Equal(got.Cmd, []string{"serve"}) ||
		got.User != "65532:65532" || file.OS != "linux" || file.Architecture != runtime.GOARCH || got.Labels["org.opencontainers.image.version"] != "1.2.3" {
		t.Errorf("config %+v (os %s, arch %s): want the binary's entrypoint, serve, user 65532, linux/%s, version 1.2.3", got, file.OS, file.Architecture, runtime.GOARCH)
	}

	layers, err := img.Layers()
	if err != nil || len(layers) != 1 {
		t.Fatalf("%d layers (%v), want 1", len(layers), err)
	}
	rc, err := layers[0].Uncompressed()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	found := map[string]*tar.Header{}
	extracted := filepath.Join(dir, "extracted")
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		found[h.Name] = h
		if h.Name == binaryPath {
			f, err := os.OpenFile(extracted, os.O_CREATE|os.O_WRONLY, 0o755)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := io.Copy(f, tr); err != nil { //nolint:gosec // the test's own binary
				t.Fatal(err)
			}
			_ = f.Close()
		}
	}
	if h := found[stateDir+"/"]; h == nil || h.Uid != nonRoot {
		t.Errorf("the state directory %v: want it owned by %d", h, nonRoot)
	}
	if runtime.GOOS != "linux" {
		t.Skip("the image's binary runs on linux")
	}
	version, err := exec.CommandContext(t.Context(), extracted, "version").Output()
	if err != nil || strings.TrimSpace(string(version)) == "" {
		t.Errorf("the image's binary: version = %q, %v", version, err)
	}
}

// Command ociimage writes mesh-provisioner's OCI image without a container
// daemon: one layer holding the static binary (and the directories it
// writes to) on an empty base, run as an unprivileged user. It writes it
// twice: as an OCI image layout (-layout; `skopeo copy oci:DIR ...`, `crane
// push DIR ...`) and as a tarball that `docker load` and `podman load` take
// (-out).
//
//	CGO_ENABLED=0 GOOS=linux go build -o bin/linux/mesh-provisioner ./cmd/mesh-provisioner
//	go run ./internal/build/ociimage -binary bin/linux/mesh-provisioner -tag mesh-provisioner:dev -layout build/image -out build/mesh-provisioner-image.tar
//
// make image does both. go-containerregistry writes the image (the library
// under crane and ko); an empty base means nothing to pull, so the build
// needs no network.
package main

import (
	"archive/tar"
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"runtime"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

// The image's layout: where the binary is, and who runs it (distroless's
// nonroot user, which the Kubernetes example's securityContext names).
const (
	binaryPath = "usr/local/bin/mesh-provisioner"
	stateDir   = "var/lib/mesh-provisioner"
	nonRoot    = 65532
)

func main() {
	var cfg config
	flag.StringVar(&cfg.binary, "binary", "", "the static linux binary of mesh-provisioner (CGO_ENABLED=0 GOOS=linux go build)")
	flag.StringVar(&cfg.tag, "tag", "mesh-provisioner:dev", "the image's name and tag in the tarball")
	flag.StringVar(&cfg.out, "out", "build/mesh-provisioner-image.tar", "the tarball to write, for docker load or podman load")
	flag.StringVar(&cfg.layout, "layout", "build/image", "the OCI image layout directory to write (replaced)")
	flag.StringVar(&cfg.arch, "arch", runtime.GOARCH, "the binary's architecture")
	flag.StringVar(&cfg.version, "version", "dev", "the version in the image's labels")
	flag.Parse()
	if err := cfg.write(); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

type config struct {
	binary, tag, out, layout, arch, version string
}

func (c config) write() error {
	if c.binary == "" {
		return errors.New("-binary is required")
	}
	ref, err := name.NewTag(c.tag)
	if err != nil {
		return fmt.Errorf("-tag %q: %w", c.tag, err)
	}
	img, err := c.image()
	if err != nil {
		return err
	}
	if err := os.RemoveAll(c.layout); err != nil {
		return err
	}
	index, err := layout.Write(c.layout, empty.Index)
	if err != nil {
		return err
	}
	if err := index.AppendImage(img, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": ref.String()})); err != nil {
		return err
	}
	return tarball.WriteToFile(c.out, ref, img)
}

// image is the binary in one layer on an empty base, its config the
// service's: serve by default, as user 65532, its state in stateDir.
func (c config) image() (v1.Image, error) {
	binary, err := os.ReadFile(c.binary)
	if err != nil {
		return nil, err
	}
	layerTar, err := layerOf(binary)
	if err != nil {
		return nil, err
	}
	layer, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(layerTar)), nil
	}, tarball.WithMediaType(types.OCILayer))
	if err != nil {
		return nil, err
	}
	base := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	base = mutate.ConfigMediaType(base, types.OCIConfigJSON)
	img, err := mutate.AppendLayers(base, layer)
	if err != nil {
		return nil, err
	}
	file, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	file = file.DeepCopy()
	file.OS, file.Architecture = "linux", c.arch
	file.Config = v1.Config{
		Entrypoint: []string{"/" + binaryPath},
		Cmd:        []string{"serve"},
		User:       fmt.Sprintf("%d:%d", nonRoot, nonRoot),
		WorkingDir: "/" + stateDir,
		Env: []string{
			"PATH=/usr/local/bin",
			"MESH_PROVISIONER_SERVE_STATE_DIR=/" + stateDir,
		},
		Labels: map[string]string{
			"org.opencontainers.image.title":   "mesh-provisioner",
			"org.opencontainers.image.version": c.version,
			"org.opencontainers.image.source":  "https://github.com/novox/mesh-provisioner",
		},
	}
	return mutate.ConfigFile(img, file)
}

// layerOf is the layer's tar: the directories, the binary and a passwd
// naming the nonroot user, each with a fixed time so that the same binary
// makes the same layer.
func layerOf(binary []byte) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	epoch := time.Unix(0, 0)
	passwd := []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/%s:/sbin/nologin\n", nonRoot, nonRoot, stateDir))
	entries := []struct {
		header tar.Header
		data   []byte
	}{
		{tar.Header{Name: "etc/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "etc/passwd", Typeflag: tar.TypeReg, Mode: 0o644}, passwd},
		{tar.Header{Name: "tmp/", Typeflag: tar.TypeDir, Mode: 0o1777}, nil},
		{tar.Header{Name: "usr/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "usr/local/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "usr/local/bin/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: binaryPath, Typeflag: tar.TypeReg, Mode: 0o755}, binary},
		{tar.Header{Name: "var/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: "var/lib/", Typeflag: tar.TypeDir, Mode: 0o755}, nil},
		{tar.Header{Name: stateDir + "/", Typeflag: tar.TypeDir, Mode: 0o700, Uid: nonRoot, Gid: nonRoot}, nil},
	}
	for _, e := range entries {
		h := e.header
		h.ModTime, h.Size, h.Format = epoch, int64(len(e.data)), tar.FormatPAX
		if err := tw.WriteHeader(&h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(e.data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

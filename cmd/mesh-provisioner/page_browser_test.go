//go:build browser

package main

import (
	"context"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestStatusPageInABrowser opens serve --http's status page in headless
// chromium (MESH_PROVISIONER_CHROMIUM, else chromium on PATH; make
// test-browser installs Debian's), checks the DOM it renders against the
// service's answers, and saves a screenshot in MESH_PROVISIONER_SCREENSHOT_DIR
// (make test-browser: build/). A browser cannot send the page's bearer
// token by itself: it is refused when it asks serve directly, and reads the
// page through a proxy that adds the token, as an operator's would.
func TestStatusPageInABrowser(t *testing.T) {
	browser := os.Getenv("MESH_PROVISIONER_CHROMIUM")
	if browser == "" {
		var err error
		if browser, err = exec.LookPath("chromium"); err != nil {
			t.Fatal("no chromium: run make test-browser, which installs it")
		}
	}
	page, nc := statusPageMesh(t)
	base := bearerProxy(t, page)
	chromium := func(args ...string) []byte {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, browser, append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
			"--no-first-run", "--user-data-dir=" + t.TempDir()}, args...)...)
		var stderr syncBuffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", browser, args, err, stderr.String())
		}
		return out
	}
	if refused := string(chromium("--dump-dom", page.base+"/")); !strings.Contains(refused, "401: ") || strings.Contains(refused, "<h1>mesh-provisioner") {
		t.Fatalf("chromium read the page without the token:\n%s", refused)
	}
	dom := string(chromium("--dump-dom", base+"/"))
	if !strings.Contains(dom, "<h1>mesh-provisioner") {
		t.Fatalf("chromium's DOM is not the status page:\n%s", dom)
	}
	checkPage(t, dom, nc)

	dir := os.Getenv("MESH_PROVISIONER_SCREENSHOT_DIR")
	if dir == "" {
		dir = t.TempDir()
	}
	shot := filepath.Join(dir, "status-page.png")
	chromium("--window-size=1280,1400", "--screenshot="+shot, base+"/")
	if info, err := os.Stat(shot); err != nil || info.Size() == 0 {
		t.Fatalf("no screenshot at %s: %v", shot, err)
	}
	t.Logf("screenshot: %s", shot)
}

// bearerProxy serves page through a reverse proxy that adds its token to
// every request, and returns the proxy's base URL.
func bearerProxy(t *testing.T, page statusPage) string {
	t.Helper()
	target, err := url.Parse(page.base)
	if err != nil {
		t.Fatal(err)
	}
	proxy := httptest.NewServer(&httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.SetURL(target) // and the Host header: serve's own
		r.Out.Header.Set("Authorization", "Bearer "+page.token)
	}})
	t.Cleanup(proxy.Close)
	return proxy.URL
}

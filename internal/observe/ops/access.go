package ops

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"runtime"
	"slices"
	"strings"
)

// The page, the node views and /metrics show what the mesh confines over
// NATS (one node's plan to that node), so they answer only a request that
// names one of the server's hosts and carries the operator's bearer token.
// /healthz and /readyz answer anyone: the kubelet sends neither, and they
// tell nothing about the mesh.

// minTokenLength is the shortest token ReadTokenFile takes: a shorter one
// could be guessed by asking.
const minTokenLength = 16

// ReadTokenFile reads the bearer token from path: the file's content
// without its trailing newline. It refuses a file that is empty, holds a
// short token or one a header cannot carry, or that every user may read.
// Its errors never hold the token.
func ReadTokenFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer func() { _ = f.Close() }()
	if err := checkNotWorldReadable(f); err != nil {
		return nil, err
	}
	content, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	token := bytes.TrimSuffix(bytes.TrimSuffix(content, []byte("\n")), []byte("\r"))
	switch {
	case len(token) == 0:
		return nil, fmt.Errorf("%s is empty: write a token into it, such as `openssl rand -hex 32`", path)
	case bytes.ContainsFunc(token, func(r rune) bool { return r <= ' ' || r > '~' }):
		return nil, fmt.Errorf("%s holds a space, a control character, a line after the first or a character beyond ASCII, which an Authorization header cannot carry", path)
	case len(token) < minTokenLength:
		return nil, fmt.Errorf("%s holds a token of %d characters: use at least %d, such as `openssl rand -hex 32`", path, len(token), minTokenLength)
	}
	return token, nil
}

// checkNotWorldReadable refuses a token file that every user on the host
// may read. A group may (a Kubernetes secret mounted with fsGroup is 0440).
func checkNotWorldReadable(f *os.File) error {
	if runtime.GOOS == "windows" { // no such permission bits
		return nil
	}
	info, err := f.Stat()
	if err != nil {
		return err
	}
	if mode := info.Mode().Perm(); mode&0o004 != 0 {
		return fmt.Errorf("%s may be read by every user (mode %04o): chmod o-r it, such as 0600", f.Name(), mode)
	}
	return nil
}

// DefaultHosts are the hosts a server listening on addr answers to when
// none are given: loopback's names, and addr's host unless it is empty or
// every interface (0.0.0.0, ::), which names no host.
func DefaultHosts(addr string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return hosts
	}
	if ip, err := netip.ParseAddr(host); err == nil && ip.IsUnspecified() {
		return hosts
	}
	if host = canonicalHost(host); !slices.Contains(hosts, host) {
		hosts = append(hosts, host)
	}
	return hosts
}

// canonicalHost is a host name or address as the Host header check
// compares it: lower case, no trailing dot, no brackets, an address in its
// shortest form.
func canonicalHost(host string) string {
	host = strings.TrimSuffix(strings.ToLower(strings.Trim(host, "[]")), ".")
	if ip, err := netip.ParseAddr(host); err == nil {
		return ip.Unmap().String()
	}
	return host
}

// access guards the paths that show the mesh.
type access struct {
	hosts map[string]bool
	// tokenSum is the token's SHA-256; comparing digests takes the same
	// time whatever the length of the token presented. Zero with no token.
	tokenSum [sha256.Size]byte
	hasToken bool
}

func newAccess(token []byte, hosts []string) *access {
	a := &access{hosts: make(map[string]bool, len(hosts)), hasToken: len(token) > 0}
	for _, h := range hosts {
		a.hosts[canonicalHost(h)] = true
	}
	if a.hasToken {
		a.tokenSum = sha256.Sum256(token)
	}
	return a
}

// guard serves next only for a request to one of the hosts that carries the
// token: 421 for another host (a DNS rebinding page's requests among them),
// 403 when no token is configured, 401 without the token.
func (a *access) guard(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-store")
		if host := requestHost(r); !a.hosts[host] {
			http.Error(w, fmt.Sprintf("421: this server does not answer to host %q: reach it by a name in serve's --http-hosts, or add this one there", host), http.StatusMisdirectedRequest)
			return
		}
		if !a.hasToken {
			http.Error(w, "403: the status page, the node views and /metrics are served only with a bearer token: start serve with --http-token-file", http.StatusForbidden)
			return
		}
		if !a.authorized(r) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="mesh-provisioner"`)
			http.Error(w, `401: send the token of serve's --http-token-file as the header "Authorization: Bearer <token>"`, http.StatusUnauthorized)
			return
		}
		next.ServeHTTP(w, r)
	})
}

// authorized reports whether r carries the token as a bearer credential.
func (a *access) authorized(r *http.Request) bool {
	scheme, token, ok := strings.Cut(r.Header.Get("Authorization"), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return false
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return subtle.ConstantTimeCompare(sum[:], a.tokenSum[:]) == 1
}

// requestHost is the host r names, without its port.
func requestHost(r *http.Request) string {
	host := r.Host
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	return canonicalHost(host)
}

// describe says, for the log, how the guarded paths answer; never the token.
func (a *access) describe() string {
	if a.hasToken {
		return "with the bearer token of --http-token-file"
	}
	return "refused (403): no --http-token-file"
}

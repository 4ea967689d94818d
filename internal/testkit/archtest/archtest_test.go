package archtest_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// module is the module's path; the rules below name its packages relative
// to it ("service", "internal/mirror").
const module = "github.com/novox/mesh-provisioner"

// pkg is what the rules read of one package, as `go list -json` reports it:
// its direct imports (test files' left out: a test may import a harness)
// and every package it links, transitively (Deps).
type pkg struct {
	ImportPath string
	Imports    []string
	Deps       []string
}

// rel returns a package's path relative to the module, and whether it is
// one of the module's.
func rel(path string) (string, bool) {
	return strings.CutPrefix(path, module+"/")
}

// under reports whether the module-relative path p is dir or below it.
func under(p, dir string) bool { return p == dir || strings.HasPrefix(p, dir+"/") }

// The floors of docs/architecture.md, by path, so that a package added
// later falls on a floor without a change here: a new package under
// internal/bench or internal/testkit is a harness, a new top-level package
// is public API.

// harness reports whether p is a benchmark or a test harness: code that
// measures or tests the service and is never linked into it.
func harness(p string) bool { return under(p, "internal/bench") || under(p, "internal/testkit") }

// production reports whether p is linked into, or builds, what ships: every
// package that is not a benchmark or a harness.
func production(p string) bool { return !harness(p) }

// public reports whether p is the public API: a package another module may
// import (not internal/), and neither the service (its rooms included)
// nor the command.
func public(p string) bool { return !under(p, "internal") && !under(p, "cmd") && !under(p, "service") }

// one returns a selector of exactly the packages named.
func one(names ...string) func(string) bool {
	return func(p string) bool { return slices.Contains(names, p) }
}

// own returns a selector of the module's packages that sel selects, for a
// rule that reads full import paths.
func own(sel func(string) bool) func(string) bool {
	return func(path string) bool {
		p, ok := rel(path)
		return ok && sel(p)
	}
}

// rule is one import rule of docs/architecture.md: no package that from
// selects (by module-relative path) may import a package that forbidden
// selects (by full import path), directly, or anywhere among what it links
// when deps is set. allowed lists the imports the code has today that
// break the rule, each with why: the rule as the code is. An allowed import
// that is gone fails the test too, so that the table, and the map, drop it.
type rule struct {
	name      string
	from      func(string) bool
	forbidden func(string) bool
	deps      bool
	allowed   map[edge]string
}

// edge is an import: the importer and the imported, module-relative.
type edge struct{ from, to string }

var rules = []rule{
	{
		name:      "production imports no benchmark or test harness",
		from:      production,
		forbidden: own(harness),
	},
	{
		name:      "the public API imports nothing under internal/, nor service",
		from:      public,
		forbidden: own(func(p string) bool { return under(p, "internal") || under(p, "service") }),
		allowed: map[edge]string{
			{"registry", "internal/kvread"}: "registry.Reconcile reads the bucket's live keys with kvread.Live; the Reconciler stops its watcher with kvread.Stop",
		},
	},
	{
		name: "a node's program links no server code",
		from: one("client", "nodeclient", "wire"),
		forbidden: func(path string) bool {
			if strings.HasPrefix(path, "github.com/nats-io/nats-server/") {
				return true
			}
			p, ok := rel(path)
			return ok && (under(p, "internal") || under(p, "cmd") || under(p, "service") || slices.Contains([]string{"seat", "registry", "buckets"}, p))
		},
		deps: true,
	},
	{
		name:      "keys, keyshape, compose, the generated types and backoff link no NATS package",
		from:      func(p string) bool { return one("keys", "keyshape", "compose", "backoff")(p) || under(p, "gen") },
		forbidden: func(path string) bool { return strings.HasPrefix(path, "github.com/nats-io/") },
		deps:      true,
	},
	{
		name:      "the copy and its helpers sit below the service",
		from:      one("internal/mirror", "internal/kvread", "internal/observe/ratelog", "internal/observe/sdnotify"),
		forbidden: own(one("service", "internal/instance", "internal/observe/ops", "internal/observe/meshstatus")),
	},
	{
		name:      "the service sits below the operators' HTTP side and the instance",
		from:      one("service"),
		forbidden: own(one("internal/observe/ops", "internal/observe/meshstatus", "internal/instance")),
	},
	{
		name:      "the rooms sit below the service, admission and plans apart",
		from:      one("service/plans", "service/admission"),
		forbidden: own(one("service", "internal/instance", "service/plans", "service/admission", "service/answers")),
	},
	{
		name:      "the answers room sits below the service, and reads admission's checks only",
		from:      one("service/answers"),
		forbidden: own(one("service", "internal/instance", "service/plans")),
	},
	{
		name: "only the command assembles an instance in production",
		from: func(p string) bool { return production(p) && p != "cmd/mesh-provisioner" },
		forbidden: own(func(p string) bool {
			return p == "internal/instance"
		}),
	},
}

// list returns every package of the module (its root is two folders up),
// as `go list` reports it with the default build constraints: a package
// whose files all need a build tag (internal/testkit/faults) is not among them.
func list(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.CommandContext(t.Context(), "go", "list", "-json=ImportPath,Imports,Deps", "./...")
	cmd.Dir = "../../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.Bytes())
	}
	var pkgs []pkg
	for dec := json.NewDecoder(bytes.NewReader(out)); ; {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("go list's output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportRules checks each rule against every package of the module.
func TestImportRules(t *testing.T) {
	t.Parallel()
	pkgs := list(t)
	if !slices.ContainsFunc(pkgs, func(p pkg) bool { return p.ImportPath == module+"/service" }) {
		t.Fatalf("go list found no %s/service among %d packages: is this the module's root?", module, len(pkgs))
	}
	for _, r := range rules {
		t.Run(r.name, func(t *testing.T) {
			t.Parallel()
			bound := 0
			used := map[edge]bool{}
			for _, p := range pkgs {
				from, ok := rel(p.ImportPath)
				if !ok || !r.from(from) {
					continue
				}
				bound++
				imports := p.Imports
				if r.deps {
					imports = p.Deps
				}
				var broken []string
				for _, imp := range imports {
					if !r.forbidden(imp) {
						continue
					}
					to, ok := rel(imp)
					if !ok {
						to = imp
					}
					if _, ok := r.allowed[edge{from, to}]; ok {
						used[edge{from, to}] = true
						continue
					}
					broken = append(broken, to)
				}
				if len(broken) > 0 {
					how := "imports"
					if r.deps {
						how = "links"
					}
					if len(broken) > 4 {
						broken = append(broken[:4:4], fmt.Sprintf("and %d more", len(broken)-4))
					}
					t.Errorf("%s %s %s: docs/architecture.md says %s", from, how, strings.Join(broken, ", "), r.name)
				}
			}
			if bound == 0 {
				t.Errorf("the rule binds no package: a package it names was moved or renamed")
			}
			for e, why := range r.allowed {
				if !used[e] {
					t.Errorf("%s no longer imports %s (allowed because %s): drop it from this table and from docs/architecture.md", e.from, e.to, why)
				}
			}
		})
	}
}

// TestKVSubjectsAreWiresAlone: a KV key's subject is spelled in one place,
// wire (KVSubject, and the prefixes it names), so that every other package,
// tests included, builds it the one way.
func TestKVSubjectsAreWiresAlone(t *testing.T) {
	t.Parallel()
	root := "../../.."
	needle := []byte(`"$KV` + `.`) // split, so that this file does not spell it
	var spelled []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		if d.IsDir() {
			if name := d.Name(); name == "node_modules" || name == ".venv" || strings.HasPrefix(name, ".") && rel != "." || rel == "wire" || rel == "build" {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		if bytes.Contains(src, needle) {
			spelled = append(spelled, filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(spelled) > 0 {
		t.Errorf("%s is spelled outside wire, in %s: build the subject with wire.KVSubject", needle, strings.Join(spelled, ", "))
	}
}

# mesh-provisioner: every tool this file runs is pinned in go.mod (Go tool
# directives) or package-lock.json (buf and protoc-gen-es from npm); nothing
# is assumed to be installed globally but Go and Node.js.

SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

BIN      := bin
BUF      := node_modules/.bin/buf
VERSION  ?= 0.1.0-dev
LDFLAGS  := -X main.version=$(VERSION)
PY_DIR   := clients/python
PY_VENV  := $(PY_DIR)/.venv
PYTHON   ?= python3
GEN_GO    := gen
GEN_TS    := clients/ts/src/gen
GEN_PY    := $(PY_DIR)/src/mesh
GENERATED := $(GEN_GO) $(GEN_TS) $(GEN_PY)
# make generate writes to a scratch folder here and only then replaces the
# three folders: a failed run leaves the committed code as it was.
GEN_TMP   := $(BIN)/generate
# Arguments for `make run`, such as RUN_ARGS="--listen 127.0.0.1:4333".
RUN_ARGS ?=

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-16s %s\n", $$1, $$2}'

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund
	@touch $@

.PHONY: tools
tools: node_modules/.package-lock.json ## Install the pinned code-generation tools (buf, protoc-gen-es)

.PHONY: build
build: ## Build bin/mesh-provisioner
	go build -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-provisioner ./cmd/mesh-provisioner

.PHONY: run
run: build ## Build and serve on an embedded NATS at 127.0.0.1:4222 (natscli's NATS_URL and NATS_CONTEXT, which serve reads, are left out)
	env -u NATS_URL -u NATS_CONTEXT -u NATS_CREDS -u NATS_NKEY $(BIN)/mesh-provisioner $(RUN_ARGS)

.PHONY: nats
nats: ## Install the nats CLI (natscli v0.5.0) as bin/nats
	GOBIN=$(CURDIR)/$(BIN) go install github.com/nats-io/natscli/nats@v0.5.0

.PHONY: image
image: ## Build the OCI image without a container daemon: build/image (an OCI layout) and build/mesh-provisioner-image.tar (docker load, podman load), tag mesh-provisioner:$(VERSION)
	CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN)/linux/mesh-provisioner ./cmd/mesh-provisioner
	go run ./internal/build/ociimage -binary $(BIN)/linux/mesh-provisioner -tag mesh-provisioner:$(VERSION) -version $(VERSION) -layout build/image -out build/mesh-provisioner-image.tar

.PHONY: generate
generate: tools python-venv ## Write the generated code of all three languages from proto/ (one buf generate with buf.gen.yaml: protoc-gen-go, protoc-gen-es, the protoc of the pinned grpcio-tools)
	rm -rf $(GEN_TMP) && mkdir -p $(GEN_TMP)
	$(BUF) generate --template buf.gen.yaml -o $(GEN_TMP)
	touch $(GEN_TMP)/$(GEN_PY)/provisioner/v1/py.typed
	for dir in $(GENERATED); do rm -rf $$dir && mv $(GEN_TMP)/$$dir $$dir; done
	rm -rf $(GEN_TMP)

.PHONY: checkgenerate
checkgenerate: generate ## Fail if generated code differs from what is committed
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		git status --porcelain -- $(GENERATED); \
		echo "generated code is out of date: run make generate and commit it"; exit 1; fi

GOLANGCI := go tool -modfile=tools/go.mod golangci-lint

.PHONY: lint
lint: tools ## buf lint and format, golangci-lint (.golangci.yml), go.mod tidy
	$(BUF) lint
	$(BUF) format --diff --exit-code
	$(GOLANGCI) run ./...
	go mod tidy -diff

.PHONY: breaking
breaking: tools ## buf breaking against main and against the parent commit
	@if git rev-parse -q --verify main >/dev/null && git cat-file -e main:buf.yaml 2>/dev/null; then \
		echo "buf breaking --against .git#branch=main"; \
		$(BUF) breaking --against ".git#branch=main"; \
	else echo "buf breaking: no branch main with a buf.yaml; nothing to compare"; fi
	@if parent=$$(git rev-parse -q --verify HEAD~1) && git cat-file -e $$parent:buf.yaml 2>/dev/null; then \
		echo "buf breaking --against .git#ref=$$parent"; \
		$(BUF) breaking --against ".git#ref=$$parent"; \
	else echo "buf breaking: no parent commit with a buf.yaml; nothing to compare"; fi

.PHONY: test
test: test-go test-browser test-ts test-python ## Run every test: Go, the status page in a headless browser, then the TypeScript and Python clients against the real binary

.PHONY: test-go
test-go: nats ## Run the Go tests (race detector on; natscli too, reading init's contexts); the conformance suite's cases by name
	MESH_PROVISIONER_NATS_BIN=$(CURDIR)/$(BIN)/nats go test -race -count=1 $$(go list ./... | grep -v '/internal/testkit/conformance$$')
	go test -race -count=1 -v -run '^TestConformance$$' ./internal/testkit/conformance \
		| grep -E '^(    --- |ok|FAIL|panic|PASS)|^\s+conformance_test' | grep -vE '^        --- '

# Debian's chromium, installed with apt when missing (as root, or with sudo).
CHROMIUM ?= $(shell command -v chromium || command -v chromium-browser || true)

.PHONY: chromium
chromium: ## Install Debian's chromium with apt-get when it is missing
	@if [ -z "$(CHROMIUM)" ]; then \
		sudo=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		apt-cache policy chromium | grep -q 'Candidate: [0-9]' || $$sudo apt-get update; \
		$$sudo apt-get install -y --no-install-recommends chromium; \
	fi

.PHONY: test-browser
test-browser: chromium ## Open serve --http's status page in headless chromium and check it against the service's answers; screenshot in build/
	mkdir -p build
	MESH_PROVISIONER_CHROMIUM=$$(command -v chromium || command -v chromium-browser) MESH_PROVISIONER_SCREENSHOT_DIR=$(CURDIR)/build \
		go test -count=1 -tags browser -run '^TestStatusPageInABrowser$$' -v ./cmd/mesh-provisioner 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+\S+_test\.go:)'

# The fault tests' own log lines (slog's text, "time=...") are left out;
# everything else shows, DATA RACE reports and panics included.
FAULTS_FILTER := grep -vE '^time='
# After a failure, each failed test's whole output is printed again at the
# end, where a CI log cut to its last lines still shows why.
FAULTS_LOG    := build/test-faults.log
# A scenario that fails fails the target: none is run again. TestFaultBlast
# bounds its recovery against a bare echo blasted alike in the same run;
# the others bound what must hold (a seat vacant at most 10 s, no acked
# write lost), with margins for a machine shared with the load.
FAULTS_FAILED := awk '/^=== RUN   [^\/]+$$/ { block = "" } { block = block $$0 "\n" } /^--- FAIL: / { printf "%s", block }'

.PHONY: test-faults
test-faults: ## Fault tests (build tag faults): restarts, leader loss and seat failover on a 3-server cluster, a flood, a client that never reads, a blast, a purge, a restart beside ready instances, start/stop races, the seat's holder through elections, a partition's holder killed (static and shared partitions); each prints its figures. RACE=-race to add the race detector to all
	@mkdir -p build && : > $(FAULTS_LOG)
	status=0; \
	go test -race -count=1 -tags faults -run '^TestFaultStartStopStats$$' -v ./internal/testkit/faults/ 2>&1 | $(FAULTS_FILTER) | tee -a $(FAULTS_LOG) || status=1; \
	go test $(RACE) -count=1 -timeout 30m -tags faults -run 'Fault' -skip '^TestFaultStartStopStats$$' -v ./internal/testkit/faults/ 2>&1 | $(FAULTS_FILTER) | tee -a $(FAULTS_LOG) || status=1; \
	go test -race -count=1 -tags faults -run '^TestHolderKeepsTheSeatThroughAnElection$$' -v ./seat/ 2>&1 | $(FAULTS_FILTER) | tee -a $(FAULTS_LOG) || status=1; \
	if [ $$status != 0 ]; then echo '=== the fault tests that failed, each with its whole output:'; $(FAULTS_FAILED) $(FAULTS_LOG); fi; \
	exit $$status

clients/ts/node_modules/.package-lock.json: clients/ts/package.json clients/ts/package-lock.json
	cd clients/ts && npm ci --no-audit --no-fund
	@touch $@

.PHONY: test-ts
test-ts: build clients/ts/node_modules/.package-lock.json ## Run the TypeScript client's tests and the conformance suite against bin/mesh-provisioner
	go build -o $(BIN)/e2e-seed ./internal/testkit/e2e/seed
	go build -o $(BIN)/e2e-authnats ./internal/testkit/e2e/authnats
	go build -o $(BIN)/conformance-apply ./internal/testkit/conformance/apply
	cd clients/ts && MESH_PROVISIONER_BIN=$(CURDIR)/$(BIN)/mesh-provisioner MESH_PROVISIONER_SEED_BIN=$(CURDIR)/$(BIN)/e2e-seed \
		MESH_PROVISIONER_AUTHNATS_BIN=$(CURDIR)/$(BIN)/e2e-authnats MESH_PROVISIONER_APPLY_BIN=$(CURDIR)/$(BIN)/conformance-apply npm test

# The venv is rebuilt whole when the lock changes, so that it holds exactly
# what the lock pins.
$(PY_VENV)/.installed: $(PY_DIR)/requirements-dev.lock $(PY_DIR)/pyproject.toml
	rm -rf $(PY_VENV)
	$(PYTHON) -m venv $(PY_VENV)
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -r $(PY_DIR)/requirements-dev.lock
	$(PY_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e $(PY_DIR)
	@touch $@

.PHONY: python-venv
python-venv: $(PY_VENV)/.installed ## Create clients/python/.venv with the packages pinned in requirements-dev.lock

.PHONY: test-python
test-python: build python-venv ## Type-check the Python client, run its tests and the conformance suite against bin/mesh-provisioner
	go build -o $(BIN)/conformance-apply ./internal/testkit/conformance/apply
	go build -o $(BIN)/e2e-authnats ./internal/testkit/e2e/authnats
	cd $(PY_DIR) && .venv/bin/mypy --strict src/mesh_provisioner tests
	cd $(PY_DIR) && MESH_PROVISIONER_BIN=$(CURDIR)/$(BIN)/mesh-provisioner MESH_PROVISIONER_APPLY_BIN=$(CURDIR)/$(BIN)/conformance-apply \
		MESH_PROVISIONER_AUTHNATS_BIN=$(CURDIR)/$(BIN)/e2e-authnats .venv/bin/pytest -v

.PHONY: conformance
conformance: build python-venv clients/ts/node_modules/.package-lock.json ## Run only the conformance suite, in Go, TypeScript and Python, each case by name
	go build -o $(BIN)/conformance-apply ./internal/testkit/conformance/apply
	MESH_PROVISIONER_BIN=$(CURDIR)/$(BIN)/mesh-provisioner go test -count=1 -v -run '^TestConformance$$' ./internal/testkit/conformance \
		| grep -E '^(    --- |ok|FAIL|panic)|^\s+conformance_test' | grep -vE '^        --- '
	cd clients/ts && npx tsc -p tsconfig.test.json && MESH_PROVISIONER_BIN=$(CURDIR)/$(BIN)/mesh-provisioner \
		MESH_PROVISIONER_APPLY_BIN=$(CURDIR)/$(BIN)/conformance-apply node --test --test-reporter=spec build-test/test/conformance.test.js
	cd $(PY_DIR) && MESH_PROVISIONER_BIN=$(CURDIR)/$(BIN)/mesh-provisioner MESH_PROVISIONER_APPLY_BIN=$(CURDIR)/$(BIN)/conformance-apply \
		.venv/bin/pytest -v tests/test_conformance.py

.PHONY: fuzz
fuzz: ## Fuzz the key parsers, the collection escape, the applied records' builds read in place, the plans writer's digest against the composition's and the digest's collected items against their encoding (FUZZTIME each, default 1m)
	go test ./keys -run '^$$' -fuzz '^FuzzCollectionEscape$$' -fuzztime $(or $(FUZZTIME),1m)
	go test ./keys -run '^$$' -fuzz '^FuzzParseKeys$$' -fuzztime $(or $(FUZZTIME),1m)
	go test ./internal/mirror -run '^$$' -fuzz '^FuzzReadBuilds$$' -fuzztime $(or $(FUZZTIME),1m)
	go test ./compose -run '^$$' -fuzz '^FuzzPlanDigest$$' -fuzztime $(or $(FUZZTIME),1m)
	go test ./compose -run '^$$' -fuzz '^FuzzAppendCollectItem$$' -fuzztime $(or $(FUZZTIME),1m)

.PHONY: bench
bench: ## Compose benchmarks: a node (vs a by-key composer that reads providers' entries and manifests too), a 1,000-node mesh (and its decoding alone), two builds vs one, a node's plan digest (vs SHA-256 alone of its bytes); MESH_COMPOSE_CAPTURE=file to replay a capture
	go test ./service/... ./compose -run '^$$' -bench 'BenchmarkCompose|BenchmarkDigest' -benchtime $(or $(BENCHTIME),2s) -count $(or $(BENCHCOUNT),1)

.PHONY: bench-plans
bench-plans: ## Plan digests at 1,000 nodes and watchers: a need to its watcher (p50, p99, vs a bare KV watch; again while 1,000 others write once a second), a registry change to all watchers, an hour of reconciles writing nothing (BENCHPLANS_ARGS="-writes 500 ...")
	go run ./internal/bench/plans $(BENCHPLANS_ARGS)

.PHONY: bench-verb
bench-verb: ## The verbs against an echo of the same bytes, at 1 and 8 requesters; copy bytes a key; cold start (BENCHVERB_ARGS="-nodes 1000 ...")
	go run ./internal/bench/verb $(BENCHVERB_ARGS)

.PHONY: bench-write
bench-write: ## The write verbs against direct KV puts of the same records: one put's p50, a node's 30 x 10 apply, 1,000 nodes applying at once (BENCHWRITE_ARGS="-nodes 1000 ...")
	go run ./internal/bench/write $(BENCHWRITE_ARGS)

.PHONY: bench-fair
bench-fair: build ## One node against another with its own grant: bob's compose and plan push while ace floods its compose subject or churns its records, against quiet, in one run (BENCHFAIR_ARGS="-asks 50 ...")
	go run ./internal/bench/fair -bin $(BIN)/mesh-provisioner $(BENCHFAIR_ARGS)

.PHONY: bench-scale
bench-scale: build ## One instance against meshes of 1k, 4k and 10k nodes (x 30 x 10) on a nats-server of its own: RSS a key, start, compose p50/p99, verb throughput; a table, and a plot in build/bench-scale.svg; with -instances 4, the same mesh served by 4 instances of a share of the partitions each, against the one (BENCHSCALE_ARGS="-nodes 100000 -modules 10 -needs 3 -instances 4 ...")
	go run ./internal/bench/scale -bin $(BIN)/mesh-provisioner -plot build/bench-scale.svg $(BENCHSCALE_ARGS)

.PHONY: ci
ci: test test-faults checkgenerate lint breaking image ## What .ci/run runs

.PHONY: clean
clean: ## Remove built binaries and the browser test's screenshot
	rm -rf $(BIN) build

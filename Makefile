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
GENERATED := gen clients/ts/src/gen
# Arguments for `make run`, such as RUN_ARGS="--listen 127.0.0.1:4333".
RUN_ARGS ?=

.PHONY: help
help: ## Show the targets
	@grep -hE '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN{FS=":.*## "}{printf "  make %-14s %s\n", $$1, $$2}'

node_modules/.package-lock.json: package.json package-lock.json
	npm ci --no-audit --no-fund
	@touch $@

.PHONY: tools
tools: node_modules/.package-lock.json ## Install the pinned code-generation tools (buf, protoc-gen-es)

.PHONY: build
build: ## Build bin/mesh-provisioner
	go build -ldflags '$(LDFLAGS)' -o $(BIN)/mesh-provisioner ./cmd/mesh-provisioner

.PHONY: run
run: build ## Build and serve on an embedded NATS at 127.0.0.1:4222
	$(BIN)/mesh-provisioner $(RUN_ARGS)

.PHONY: nats
nats: ## Install the nats CLI (natscli v0.5.0) as bin/nats
	GOBIN=$(CURDIR)/$(BIN) go install github.com/nats-io/natscli/nats@v0.5.0

.PHONY: generate
generate: tools ## Write gen/ and clients/ts/src/gen from proto/ with buf
	rm -rf $(GENERATED)
	$(BUF) generate

.PHONY: checkgenerate
checkgenerate: generate ## Fail if generated code differs from what is committed
	@if [ -n "$$(git status --porcelain -- $(GENERATED))" ]; then \
		git status --porcelain -- $(GENERATED); \
		echo "generated code is out of date: run make generate and commit it"; exit 1; fi

.PHONY: lint
lint: tools ## buf lint and format, gofmt, go vet
	$(BUF) lint
	$(BUF) format --diff --exit-code
	@unformatted=$$(gofmt -l $$(git ls-files '*.go' | grep -v '^gen/')); \
		if [ -n "$$unformatted" ]; then echo "gofmt needed: $$unformatted"; exit 1; fi
	go vet ./...

.PHONY: breaking
breaking: tools ## buf breaking against the parent commit
	@if parent=$$(git rev-parse -q --verify HEAD~1) && git cat-file -e $$parent:buf.yaml 2>/dev/null; then \
		echo "buf breaking --against .git#ref=$$parent"; \
		$(BUF) breaking --against ".git#ref=$$parent"; \
	else echo "buf breaking: no parent commit with a buf.yaml; nothing to compare"; fi

.PHONY: test
test: test-go test-ts ## Run every test: Go, then the TypeScript client against the real binary

.PHONY: test-go
test-go: ## Run the Go tests (race detector on)
	go test -race -count=1 ./...

.PHONY: test-faults
test-faults: ## Fault tests (build tag faults): NATS restarts, leader loss in a 3-server cluster, a flood; about 2 minutes. RACE=-race to add the race detector
	go test $(RACE) -count=1 -tags faults -run 'Fault' -v ./internal/faults/ 2>&1 | grep -E '^(=== RUN|--- |PASS|FAIL|ok|\s+\S+_test\.go:)'

clients/ts/node_modules/.package-lock.json: clients/ts/package.json clients/ts/package-lock.json
	cd clients/ts && npm ci --no-audit --no-fund
	@touch $@

.PHONY: test-ts
test-ts: build clients/ts/node_modules/.package-lock.json ## Run the TypeScript client's tests against bin/mesh-provisioner
	go build -o $(BIN)/e2e-seed ./internal/e2e/seed
	cd clients/ts && MESH_PROVISIONER_BIN=$(CURDIR)/$(BIN)/mesh-provisioner MESH_PROVISIONER_SEED_BIN=$(CURDIR)/$(BIN)/e2e-seed npm test

.PHONY: fuzz
fuzz: ## Fuzz the key parsers and the collection escape (FUZZTIME each, default 1m)
	go test ./keys -run '^$$' -fuzz '^FuzzCollectionEscape$$' -fuzztime $(or $(FUZZTIME),1m)
	go test ./keys -run '^$$' -fuzz '^FuzzParseKeys$$' -fuzztime $(or $(FUZZTIME),1m)

.PHONY: bench
bench: ## Compose benchmarks: a node (vs a by-key composer) and a 1,000-node mesh; MESH_COMPOSE_CAPTURE=file to replay a capture
	go test ./service -run '^$$' -bench 'BenchmarkCompose' -benchtime $(or $(BENCHTIME),2s) -count $(or $(BENCHCOUNT),1)

.PHONY: ci
ci: test checkgenerate lint breaking ## What .ci/run runs

.PHONY: clean
clean: ## Remove built binaries
	rm -rf $(BIN)

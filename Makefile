# vgpu-dra — build, test and run targets. See README.md.
SHELL := /bin/bash
GO ?= go
OUTPUT ?= $(CURDIR)/_output
BIN := $(OUTPUT)/bin
GO_PACKAGES := ./...
# Short: unix socket paths in tests must stay under ~100 bytes.
export TMPDIR ?= /tmp

.PHONY: all build test test-go lint bench clean

all: build

## build: compile every Go binary into _output/bin.
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -o $(BIN)/ ./cmd/...

## test: unit and integration tests (Go, under the race detector).
test: test-go

test-go:
	$(GO) test -race -count=1 -timeout 20m $(GO_PACKAGES)

## lint: gofmt and go vet.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(GO_PACKAGES)

## bench: benchmarks that print ratios against baselines measured in the same run.
bench:
	$(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 30m ./test/integration/...

clean:
	rm -rf $(OUTPUT)

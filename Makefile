# vgpu-dra — build, test and run targets. See README.md.
SHELL := /bin/bash
GO ?= go
OUTPUT ?= $(CURDIR)/_output
BIN := $(OUTPUT)/bin
GO_PACKAGES := ./...
# Short: unix socket paths in tests must stay under ~100 bytes.
export TMPDIR ?= /tmp

.PHONY: all build test-deps test test-go test-tools test-monitoring test-library test-library-relwithdebinfo test-library-debug test-library-asan lint fuzz fuzz-long bench bench-go bench-library bench-compare bench-throughput bench-summary clean
.PHONY: cluster-bins cluster-up cluster-down e2e chaos chaos-short demo bench-webhook escape gpu-check-bins

all: build

## build: compile every Go binary into _output/bin, without the symbol table and DWARF (-s -w,
## as Kubernetes builds its binaries: stack traces keep their names; the plugin's binary is 97 →
## 69 MB, its RSS the same, docs/performance.md).
GO_LDFLAGS ?= -s -w
build:
	@mkdir -p $(BIN)
	$(GO) build -trimpath -ldflags '$(GO_LDFLAGS)' -o $(BIN)/ ./cmd/...

## test: unit and integration tests (Go, under the race detector) and the libvgpu.so suite
## (CTest), plain and under AddressSanitizer/UndefinedBehaviorSanitizer.
test: test-deps test-go test-tools test-monitoring test-library test-library-asan

# Debian packages the suites need (installed only when missing).
test-deps:
	hack/install-test-deps.sh

test-go:
	$(GO) test -race -count=1 -timeout 20m $(GO_PACKAGES)

# hack/tools is its own module (the image tool's dependencies stay out of the product's go.mod).
test-tools:
	cd hack/tools && $(GO) test -count=1 ./...

# The chart's alert rules: valid, and firing exactly where test/monitoring/alerts_test.yaml says
# (promtool from Debian's prometheus package). That they name only metrics the plugin exports
# is pkg/plugin's TestMonitoringNamesExportedMetrics, in test-go.
test-monitoring:
	promtool check rules deployments/helm/vgpu-dra/files/alerts.yaml
	promtool test rules test/monitoring/alerts_test.yaml

LIBRARY_BUILD := $(OUTPUT)/library
LIBRARY_DEBUG_BUILD := $(OUTPUT)/library-debug
LIBRARY_ASAN_BUILD := $(OUTPUT)/library-asan

# library_ctest <build dir> <cmake options>: configure, build, run the library's CTest.
define library_ctest
	cmake -S library -B $(1) $(2)
	cmake --build $(1) -j2
	ctest --test-dir $(1) --output-on-failure
endef

# Every supported build type: RelWithDebInfo (what ships) and Debug (-O0: no inlined libm,
# no optimiser hiding a missing symbol), then ASan + UBSan.
test-library: test-library-relwithdebinfo test-library-debug

test-library-relwithdebinfo:
	$(call library_ctest,$(LIBRARY_BUILD),-DCMAKE_BUILD_TYPE=RelWithDebInfo)

test-library-debug:
	$(call library_ctest,$(LIBRARY_DEBUG_BUILD),-DCMAKE_BUILD_TYPE=Debug)

test-library-asan:
	$(call library_ctest,$(LIBRARY_ASAN_BUILD),-DCMAKE_BUILD_TYPE=RelWithDebInfo -DVGPU_SANITIZE=ON)

## lint: gofmt, go vet (also the cluster suites behind their build tags), go.mod/go.sum tidy
## (product and hack/tools), the package map (docs/reference/code-layout.md) up to date.
lint:
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(GO_PACKAGES)
	$(GO) vet -tags e2e ./test/e2e/
	$(GO) vet -tags benchcompare ./test/benchcompare/
	$(GO) vet -tags chaos ./test/chaos/
	$(GO) vet -tags escape ./test/escape/
	$(GO) vet -tags gpu ./pkg/enforce/
	hack/check-readme-layout.sh
	@for m in . hack/tools; do \
	  if ! out=$$(cd $$m && GOFLAGS= $(GO) mod tidy -diff 2>&1); then \
	    echo "go.mod/go.sum in $$m are not tidy (run: cd $$m && go mod tidy):"; echo "$$out"; exit 1; fi; \
	done

## escape: the red-team suite (test/escape; root, about 2 min): each technique a tenant would try
## to get more than its claim, run in a container-like sandbox against the shipped libvgpu.so,
## the fake driver and the node's real registry and enforcer; fails when one gets more than its
## claim, or when docs/design/threat-model.md's table of verdicts differs from what it saw
## (ESCAPE_UPDATE=1 rewrites the table). Figures: _output/escape/report.md.
escape:
	cmake -S library -B $(LIBRARY_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(LIBRARY_BUILD) -j2
	cd test/escape && LIBRARY_BUILD=$(LIBRARY_BUILD) ESCAPE_REPORT=$(OUTPUT)/escape/report.md $(GO) test -tags escape -count=1 -timeout 15m .
	@cat $(OUTPUT)/escape/report.md

## fuzz: bounded fuzzing of the registry frame parser (the corpus of new findings stays in
## Go's fuzz cache on the machine; crashers are written to pkg/registry/testdata/fuzz).
FUZZTIME ?= 30s
fuzz:
	$(GO) test ./pkg/registry -run '^$$' -fuzz '^FuzzParseFrame$$' -fuzztime $(FUZZTIME)

## fuzz-long: every fuzz target for FUZZ_LONG_TIME each (outside CI): the registry frame parser
## and the vgpu.config reader in Go, the library's vgpu.config reader under libFuzzer
## (hack/fuzz-library.sh). A crasher becomes a regression test (testdata/fuzz, library/test/fuzz/corpus).
FUZZ_LONG_TIME ?= 10m
fuzz-long:
	$(GO) test ./pkg/registry -run '^$$' -fuzz '^FuzzParseFrame$$' -fuzztime $(FUZZ_LONG_TIME)
	$(GO) test ./pkg/contract -run '^$$' -fuzz '^FuzzParseContainerConfig$$' -fuzztime $(FUZZ_LONG_TIME)
	hack/fuzz-library.sh $(FUZZ_LONG_TIME)

## bench: benchmarks that print ratios against baselines measured in the same run, then one table
## of every target of hack/bench-targets.txt with its ratio and PASS/MISS (bench-summary). Includes
## bench-compare, which needs root and the cluster's etcd and kube-apiserver (built and cached by
## make cluster-bins on first use). Figures: docs/performance.md.
BENCH_OUT := $(OUTPUT)/bench
bench:
	@rm -f $(BENCH_OUT)/go.txt $(BENCH_OUT)/compare.txt $(BENCH_OUT)/library.txt $(BENCH_OUT)/library-overhead.txt
	$(MAKE) --no-print-directory bench-go bench-library
	BENCH_COMPARE_NO_SUMMARY=1 hack/bench-compare.sh
	@$(MAKE) --no-print-directory bench-summary

bench-go:
	@mkdir -p $(BENCH_OUT)
	set -o pipefail; $(GO) test -run '^$$' -bench . -benchmem -count=1 -timeout 30m $(GO_PACKAGES) | tee $(BENCH_OUT)/go.txt

## bench-compare (outside CI): our plugin and Kubernetes' e2e DRA test driver side by side through
## one kubelet-protocol harness against one real API server, interleaved (hack/bench-compare.sh).
bench-compare:
	hack/bench-compare.sh

## bench-throughput (outside CI): pods bound per second by the control plane, vGPU pods against
## plain pods, at the controller-manager's and scheduler's default and raised client QPS, on 25
## simulated nodes (test/benchcompare; docs/performance.md, "Cluster settings that bound vGPU pod throughput").
bench-throughput:
	BENCH_COMPARE_SELECT='^BenchmarkPodThroughput$$' hack/bench-compare.sh

## bench-summary: the targets table from the last bench-go, bench-library and bench-compare outputs
## (the library's start-up bench prints its figures as a `go test -bench` line too).
bench-summary:
	@echo; echo "== performance targets (hack/bench-targets.txt) =="
	@cd hack/tools && $(GO) run ./cmd/benchsummary -targets ../bench-targets.txt $(BENCH_OUT)/go.txt $(BENCH_OUT)/library.txt $(BENCH_OUT)/library-overhead.txt $(BENCH_OUT)/compare.txt

## gpu-check-bins: what hack/gpu-check.sh runs, built here for a GPU machine without Go: the
## library suite's gpu_check, the enforcer's and the MIG code path's GPU test binaries, in $(LIBRARY_BUILD).
gpu-check-bins:
	cmake -S library -B $(LIBRARY_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(LIBRARY_BUILD) -j2 --target vgpu vgpu-test gpu_check scripted_registry_main
	$(GO) test -c -tags gpu -o $(LIBRARY_BUILD)/enforce-gpu.test ./pkg/enforce/
	$(GO) test -c -tags gpu -o $(LIBRARY_BUILD)/gpu-mig.test ./pkg/gpu/

bench-library:
	cmake -S library -B $(LIBRARY_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo
	cmake --build $(LIBRARY_BUILD) -j2 --target bench_overhead test_core_shared_sim bench_startup
	@mkdir -p $(BENCH_OUT)
	set -o pipefail; $(LIBRARY_BUILD)/test/bench_overhead | tee $(BENCH_OUT)/library-overhead.txt
	@echo
	$(LIBRARY_BUILD)/test/test_core_shared_sim bench
	@echo
	@mkdir -p $(BENCH_OUT)
	set -o pipefail; $(LIBRARY_BUILD)/test/bench_startup | tee $(BENCH_OUT)/library.txt

clean:
	rm -rf $(OUTPUT)

## cluster-bins: build (once per version, cached per machine) the local cluster's binaries. See hack/README.md.
cluster-bins:
	hack/build-cluster-bins.sh

## cluster-up: start the single-node test cluster (etcd, control plane, containerd, kubelet).
cluster-up: cluster-bins
	hack/cluster-up.sh

## cluster-down: stop it and check that nothing it started or changed is left.
cluster-down:
	hack/cluster-down.sh

## e2e: the cluster suite: cluster bins (built once, cached per machine), cluster up, images,
## test/e2e, cluster down (always). Needs root.
e2e:
	hack/e2e.sh

## chaos: the chaos suite in full (test/chaos, build tag chaos): faults injected while vGPU pods
## churn, invariants checked, a summary table printed. Cluster bins (once), cluster up with the
## suite's settings, cluster down (always). Needs root. Run time: hack/README.md, "The chaos suite".
chaos:
	hack/chaos.sh full

## chaos-short: a few iterations of each fault, about 10 minutes (CI, after make e2e).
chaos-short:
	hack/chaos.sh short

## bench-webhook: admission latency of a vGPU pod through the webhook, on the local cluster
## (up, chart, BenchmarkWebhookAdmission in test/e2e, down). Needs root; figures: docs/performance.md.
bench-webhook: cluster-bins
	E2E_GO_TEST_ARGS='-v -run ^$$ -bench ^BenchmarkWebhookAdmission$$ -benchtime 2000x' hack/e2e.sh

## demo: cluster up with simulated H200s, the chart installed, two pods sharing one GPU, a
## summary of what each got, kubectl vgpu and the per-container metrics. MODE=device-plugin shows
## the device-plugin mode instead (shares of vgpu.dra.dev/vgpu). Leaves the cluster up (make
## cluster-down removes it). The script builds the cluster binaries once, under the suite lock.
MODE ?= dra
demo:
	MODE=$(MODE) hack/demo.sh

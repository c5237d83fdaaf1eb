#!/usr/bin/env bash
# make bench-compare (outside CI): vgpu-kubelet-plugin and Kubernetes' e2e DRA test driver side by
# side, through one kubelet-protocol harness against one real API server, interleaved over rounds
# (test/benchcompare). Prints the comparison and the rows of hack/bench-targets.txt it measures;
# the output is kept in _output/bench/compare.txt for make bench's summary.
#
# The test driver (k8s.io/kubernetes/test/e2e/dra/test-driver) is built from the Kubernetes module
# the local cluster is built from (hack/tools/kube, v1.37.2) and cached per machine like the
# cluster's binaries; the API server is the cluster's etcd and kube-apiserver. The benchmark starts
# them itself, on free loopback ports and temp dirs, and stops them (and both drivers) by PID when
# it ends; it records each PID, and this script kills any that outlived it. It takes the
# machine-wide suite lock, so
# it never runs next to an e2e suite on this machine. Needs root: our plugin mounts a tmpfs per
# claim, and the CDI dirs are a tmpfs as on a node.
#
# BENCH_COMPARE_PERF=1 records a CPU profile of the whole machine while the benchmark runs (perf
# record -a -g) into _output/bench/compare.perf.data and prints each driver's top functions:
# both drivers' CPU in the same run, with their callers (perf report --comm ... -G).
#
# BENCH_COMPARE_ROUNDS (default 3) sets the rounds. BENCH_COMPARE_SELECT picks the benchmarks
# (default ^BenchmarkCompare$; make bench-throughput runs ^BenchmarkPodThroughput$, the control
# plane's pod throughput with vGPU claims against plain pods, docs/performance.md, "Cluster settings that bound vGPU pod throughput").
set -euo pipefail

export LOG_NAME=bench-compare
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

readonly KUBE_MODULE_DIR="${REPO_ROOT}/hack/tools/kube"
readonly BENCH_OUT="${REPO_ROOT}/_output/bench"
readonly TEST_DRIVER_PKG=k8s.io/kubernetes/test/e2e/dra/test-driver

# build_test_driver prints the path of the test driver binary, built once per recipe into the
# machine cache. It is built in a copy of the wrapper module: the driver needs a few go.sum
# entries the cluster's commands do not (the CDI spec types), and adding them to hack/tools/kube
# would change the recipe hash of every cluster binary.
build_test_driver() {
  local hash dir tmp
  hash="$( { declare -f build_test_driver; cat "${KUBE_MODULE_DIR}/go.mod" "${KUBE_MODULE_DIR}/go.sum"; } | sha256sum | cut -c1-12)"
  dir="${CLUSTER_CACHE}/bin/dra-test-driver-${hash}"
  if [[ ! -x "${dir}/dra-test-driver" ]]; then
    log "building the DRA test driver (${TEST_DRIVER_PKG}) into ${dir}"
    tmp="$(mktemp -d)"
    cp "${KUBE_MODULE_DIR}/go.mod" "${KUBE_MODULE_DIR}/go.sum" "${tmp}/"
    mkdir -p "${dir}.partial.$$"
    (cd "${tmp}" && CGO_ENABLED=0 GOFLAGS=-mod=mod nice -n 19 go build -trimpath -ldflags "-s -w" -o "${dir}.partial.$$/dra-test-driver" "${TEST_DRIVER_PKG}") >&2
    rm -rf "${tmp}"
    mv -T "${dir}.partial.$$" "${dir}"
  fi
  echo "${dir}/dra-test-driver"
}

# kill_leftovers SIGKILLs every process the benchmark recorded that still runs the executable it
# started (a benchmark killed before its cleanup ran leaves them).
kill_leftovers() {
  local pid exe
  [[ -f "${PIDS_FILE}" ]] || return 0
  while read -r pid exe; do
    if [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "$(readlink -f "${exe}")" ]]; then
      log "stopping ${exe} (pid ${pid}), left by the benchmark"
      kill -KILL "${pid}" 2>/dev/null || true
    fi
  done <"${PIDS_FILE}"
  rm -f "${PIDS_FILE}"
}

main() {
  require_root
  take_suite_lock
  PIDS_FILE="$(mktemp)"
  trap kill_leftovers EXIT
  "${HACK_DIR}/build-cluster-bins.sh" etcd kube
  local test_driver plugin
  test_driver="$(build_test_driver)"
  mkdir -p "${REPO_ROOT}/_output/bin" "${BENCH_OUT}"
  plugin="${REPO_ROOT}/_output/bin/vgpu-kubelet-plugin"
  # both drivers as their projects ship them: without the symbol table and DWARF (-s -w)
  (cd "${REPO_ROOT}" && go build -trimpath -ldflags "-s -w" -o "${plugin}" ./cmd/vgpu-kubelet-plugin)
  (cd "${REPO_ROOT}" && go test -tags benchcompare -c -o "${BENCH_OUT}/benchcompare.test" ./test/benchcompare)
  local select="${BENCH_COMPARE_SELECT:-^BenchmarkCompare\$}" out="${BENCH_OUT}/compare.txt"
  [[ "${select}" == '^BenchmarkCompare$' ]] || out="${BENCH_OUT}/throughput.txt"
  log "running test/benchcompare ${select} (${BENCH_COMPARE_ROUNDS:-3} rounds, interleaved)"
  local profile=()
  if [[ -n "${BENCH_COMPARE_PERF:-}" ]]; then
    command -v perf >/dev/null || die "BENCH_COMPARE_PERF needs perf (Debian: linux-perf)"
    profile=(perf record -q -a -g -F 499 -o "${BENCH_OUT}/compare.perf.data" --)
  fi
  (cd "${REPO_ROOT}/test/benchcompare" &&
    VGPU_BENCH_CLUSTER_BIN="${CLUSTER_BIN}" VGPU_BENCH_TEST_DRIVER="${test_driver}" VGPU_BENCH_PLUGIN="${plugin}" \
      VGPU_BENCH_PIDS="${PIDS_FILE}" VGPU_BENCH_ROUNDS="${BENCH_COMPARE_ROUNDS:-3}" \
      "${profile[@]}" "${BENCH_OUT}/benchcompare.test" -test.run '^$' -test.bench "${select}" -test.benchtime 1x -test.v -test.timeout 60m) |
    tee "${out}"
  if [[ -n "${BENCH_COMPARE_PERF:-}" ]]; then
    local comm
    # The kernel's command names, cut to 15 characters.
    for comm in vgpu-kubelet-pl dra-test-driver kube-apiserver etcd; do
      log "CPU profile of ${comm} (self time, top 25; callers: perf report -i ${BENCH_OUT}/compare.perf.data --comm ${comm} -G)"
      perf report -q -i "${BENCH_OUT}/compare.perf.data" --comm "${comm}" --no-children --sort symbol --stdio -g none 2>/dev/null | head -25
    done
  fi
  # make bench prints one table of every target at its end; alone, the rows measured here.
  if [[ -z "${BENCH_COMPARE_NO_SUMMARY:-}" && "${out}" == */compare.txt ]]; then
    (cd "${REPO_ROOT}/hack/tools" && go run ./cmd/benchsummary -measured-only -targets ../bench-targets.txt "${out}")
  fi
}

main "$@"

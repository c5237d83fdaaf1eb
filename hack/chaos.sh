#!/usr/bin/env bash
# make chaos / make chaos-short: the chaos suite (test/chaos, build tag chaos) on the local
# cluster. Faults are injected while vGPU pods churn, and invariants are checked after each and
# at the end; the suite prints a summary table. The cluster is brought up with the settings the
# suite needs and always taken down again, also when the suite fails; cluster-down's check then
# proves that nothing the faults started or mounted is left.
#
# Usage: hack/chaos.sh full|short
#   full   every fault at its full count (containerd killed 20 times, the plugin killed in 100
#          Prepares, ...); see hack/README.md for the run time
#   short  a few iterations of each fault, about 10 minutes (CI, after make e2e)
# CHAOS_GO_TEST_ARGS replaces go test's -count=1, e.g. '-run TestChaos/node-reboot -count=3' to
# repeat one fault (the end checks run after each repeat).
set -euo pipefail

export LOG_NAME=chaos
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

# Cluster settings of the suite (hack/README.md, "The chaos suite"): the kubelet restarts a
# killed plugin within a second instead of backing off for minutes, and the plugin's state dir is
# a small file system of its own that the suite can fill.
export VGPU_DRA_KUBELET_MAX_RESTART_PERIOD=1s
export VGPU_DRA_STATE_DIR_SIZE=64m

# save_plugin_logs keeps the plugin's container logs (every instance the kubelet still has) in
# _output/chaos/plugin-logs: cluster-down removes /var/log/pods.
save_plugin_logs() {
  local dest="${REPO_ROOT}/_output/chaos/plugin-logs" dir
  rm -rf "${dest}"
  for dir in /var/log/pods/vgpu-dra_*; do
    [[ -d "${dir}" ]] || continue
    mkdir -p "${dest}"
    cp -rL "${dir}" "${dest}/" 2>/dev/null || true
  done
}

teardown() {
  local rc=$?
  log "taking the cluster down"
  # A suite killed by its timeout may leave the API server frozen: SIGTERM would not reach it.
  "${HACK_DIR}/chaos/apiserver.sh" thaw || true
  save_plugin_logs
  make -C "${REPO_ROOT}" --no-print-directory cluster-down || rc=1
  exit "${rc}"
}

main() {
  local form="${1:-}" timeout start=${SECONDS}
  case "${form}" in
    full) timeout=120m ;;
    short) timeout=25m ;;
    *) die "usage: $0 full|short" ;;
  esac
  require_root
  take_suite_lock
  start=${SECONDS} # the run time, not the wait for another suite's cluster
  # Once, here (as hack/e2e.sh does): make chaos does not depend on cluster-bins, and
  # cluster-up.sh runs directly, so the build lock is not waited on twice.
  "${HACK_DIR}/build-cluster-bins.sh"
  "${HACK_DIR}/build-artifacts.sh"
  trap teardown EXIT
  # A cluster left up (make demo) has other settings: cluster-up would keep it as it is.
  take_down_cluster_left_up "the chaos suite"
  "${HACK_DIR}/cluster-up.sh"
  "${HACK_DIR}/images.sh" plugin test-workload
  log "running test/chaos (${form})"
  local args=(-count=1)
  [[ -n "${CHAOS_GO_TEST_ARGS:-}" ]] && read -r -a args <<<"${CHAOS_GO_TEST_ARGS}"
  (cd "${REPO_ROOT}" && KUBECONFIG="${KUBECONFIG_ADMIN}" CHAOS_FORM="${form}" \
    go test -tags chaos -v -timeout "${timeout}" "${args[@]}" ./test/chaos/)
  log "chaos suite (${form}) passed in $(format_duration $((SECONDS - start)))"
}

main "$@"

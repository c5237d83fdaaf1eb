#!/usr/bin/env bash
# Stops the local cluster started by hack/cluster-up.sh and undoes everything it changed on this
# machine (processes, mounts, bridge, iptables chains, cgroups, sysctls, directories it created),
# then checks with hack/cluster-check-clean.sh that nothing is left, and exits non-zero if
# something is. Safe to run when the cluster is down or half started.
set -euo pipefail

export LOG_NAME=cluster-down
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"
# shellcheck source=hack/lib/teardown.sh
source "${HACK_DIR}/lib/teardown.sh"

main() {
  local start=${SECONDS}
  require_root
  take_cluster_lock
  teardown_cluster
  # The check compares against the baseline recorded by cluster-up, which lives in RUN_DIR: run
  # it before RUN_DIR goes. On failure RUN_DIR stays for inspection and for the next teardown.
  "${HACK_DIR}/cluster-check-clean.sh" --baseline "${BASELINE_DIR}"
  remove_run_dir
  log "cluster down in $(format_duration $((SECONDS - start))); component logs: ${SAVED_LOG_DIR}"
}

main "$@"

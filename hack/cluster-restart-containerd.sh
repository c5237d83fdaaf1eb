#!/usr/bin/env bash
# Fault injection for the e2e suite: SIGKILLs the local cluster's containerd (as a crash would)
# and starts it again with the same configuration. Running containers survive (their shims
# outlive containerd); NRI plugins lose their connection and must reconnect by themselves.
set -euo pipefail

export LOG_NAME=restart-containerd
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"
# shellcheck source=hack/lib/start.sh
source "${HACK_DIR}/lib/start.sh"

main() {
  require_root
  take_cluster_lock
  local pid
  pid="$(recorded_pid containerd)" || die "containerd is not running: make cluster-up"
  log "SIGKILL containerd (pid ${pid})"
  kill -KILL "${pid}"
  while kill -0 "${pid}" 2>/dev/null; do sleep 0.05; done
  start_containerd
}

main "$@"

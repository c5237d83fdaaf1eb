#!/usr/bin/env bash
# Fault injection for the chaos suite: restarts the local cluster's kubelet with the same
# configuration, SIGTERM first (as systemctl restart does) or, with --kill, SIGKILL (a crash).
# Pods keep running; the kubelet finds them again, asks the DRA driver to prepare their claims
# again and re-registers the plugin.
#
# Usage: hack/chaos/restart-kubelet.sh [--kill]
set -euo pipefail

export LOG_NAME=chaos-kubelet
CHAOS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${CHAOS_DIR}/../lib/cluster.sh"
# shellcheck source=hack/lib/start.sh
source "${CHAOS_DIR}/../lib/start.sh"

main() {
  require_root
  take_cluster_lock
  local pid
  pid="$(recorded_pid kubelet)" || die "the kubelet is not running: make cluster-up"
  if [[ "${1:-}" == --kill ]]; then
    log "SIGKILL kubelet (pid ${pid})"
    kill -KILL "${pid}"
    while kill -0 "${pid}" 2>/dev/null; do sleep 0.05; done
  else
    log "stopping kubelet (pid ${pid})"
    stop_pid "${pid}" kubelet
  fi
  start_kubelet "$(node_ip)"
}

main "$@"

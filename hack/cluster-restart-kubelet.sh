#!/usr/bin/env bash
# Fault injection for the e2e and chaos suites: restarts the local cluster's kubelet with the
# same configuration, SIGTERM first (as an upgrade or `systemctl restart kubelet` does) or, with
# --kill, SIGKILL (a crash). Running containers survive; the kubelet finds them again and asks
# the DRA driver to prepare their claims again. A starting kubelet removes every socket in
# <kubelet>/device-plugins and listens on kubelet.sock anew: device plugins must notice and
# register again, or their resources stay at 0 allocatable. Returns once the kubelet is healthy
# and the node Ready.
#
# Usage: hack/cluster-restart-kubelet.sh [--kill]
set -euo pipefail

export LOG_NAME=restart-kubelet
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"
# shellcheck source=hack/lib/start.sh
source "${HACK_DIR}/lib/start.sh"

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
    log "SIGTERM kubelet (pid ${pid})"
    stop_pid "${pid}" kubelet 30
  fi
  start_kubelet "$(node_ip)"
}

main "$@"

#!/usr/bin/env bash
# Fault injection for the e2e suite: restarts the local cluster's kubelet as an upgrade or a
# `systemctl restart kubelet` would (SIGTERM, wait, start again with the same configuration).
# Running containers survive. A starting kubelet removes every socket in
# <kubelet>/device-plugins and listens on kubelet.sock anew: device plugins must notice and
# register again, or their resources stay at 0 allocatable. Returns once the kubelet is healthy.
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
  log "SIGTERM kubelet (pid ${pid})"
  stop_pid "${pid}" kubelet 30
  start_kubelet "$(node_ip)"
}

main "$@"

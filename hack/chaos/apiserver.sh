#!/usr/bin/env bash
# Fault injection for the chaos suite: makes the API server unreachable for its clients, and
# reachable again. SIGSTOP freezes the recorded kube-apiserver process: the kernel still accepts
# connections, but nothing answers, so every client waits for its own deadline as it would behind
# a partition that drops packets. Nothing else changes (etcd, certificates, iptables).
#
# Usage: hack/chaos/apiserver.sh freeze|thaw   (thaw is safe to repeat, and runs in every teardown)
set -euo pipefail

export LOG_NAME=chaos-apiserver
CHAOS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${CHAOS_DIR}/../lib/cluster.sh"

main() {
  require_root
  local pid
  case "${1:-}" in
    freeze)
      pid="$(recorded_pid kube-apiserver)" || die "kube-apiserver is not running"
      log "SIGSTOP kube-apiserver (pid ${pid})"
      kill -STOP "${pid}"
      ;;
    thaw)
      pid="$(recorded_pid kube-apiserver)" || return 0
      if [[ "$(awk '{ print $3 }' "/proc/${pid}/stat" 2>/dev/null)" == T ]]; then
        log "SIGCONT kube-apiserver (pid ${pid})"
      fi
      kill -CONT "${pid}" 2>/dev/null || true
      ;;
    *) die "usage: $0 freeze|thaw" ;;
  esac
}

main "$@"

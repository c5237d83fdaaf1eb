#!/usr/bin/env bash
# Fault injection for the chaos suite: finds, or SIGKILLs, the running vgpu-kubelet-plugin (the
# DaemonSet's container) by PID, as the OOM killer would. The kubelet restarts the container.
#
# Usage: hack/chaos/plugin.sh pid    prints the plugin's host PID (exactly one must run)
#        hack/chaos/plugin.sh kill   SIGKILLs it and waits until it is gone
set -euo pipefail

export LOG_NAME=chaos-plugin
CHAOS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${CHAOS_DIR}/../lib/cluster.sh"

# plugin_pids prints the init PID of every running containerd task whose command is the plugin:
# the PIDs come from the runtime, the identity from the kernel (/proc/PID/cmdline), never from a
# process name match over the whole machine.
plugin_pids() {
  local pid argv0
  while read -r pid; do
    argv0="$(tr '\0' '\n' <"/proc/${pid}/cmdline" 2>/dev/null | head -n 1)" || continue
    [[ "${argv0}" == vgpu-kubelet-plugin ]] && echo "${pid}"
  done < <(ctr_k8s tasks ls 2>/dev/null | awk '$3 == "RUNNING" { print $2 }')
  return 0
}

# the_plugin_pid prints the one plugin PID, or fails saying how many there are.
the_plugin_pid() {
  local pids
  pids="$(plugin_pids)"
  [[ -n "${pids}" ]] || die "no vgpu-kubelet-plugin task is running"
  [[ "$(wc -l <<<"${pids}")" -eq 1 ]] || die "more than one vgpu-kubelet-plugin task runs: ${pids//$'\n'/ }"
  echo "${pids}"
}

main() {
  require_root
  local pid
  case "${1:-}" in
    pid) the_plugin_pid ;;
    kill)
      pid="$(the_plugin_pid)"
      log "SIGKILL vgpu-kubelet-plugin (pid ${pid})"
      kill -KILL "${pid}"
      while kill -0 "${pid}" 2>/dev/null; do sleep 0.05; done
      ;;
    *) die "usage: $0 pid|kill" ;;
  esac
}

main "$@"

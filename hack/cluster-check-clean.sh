#!/usr/bin/env bash
# Asserts that the local cluster left nothing behind: no cluster process (by executable), no
# mount under the run dir or the kubelet root, no CNI bridge, no kubepods cgroup, no KUBE-*/CNI-*
# iptables chain and no changed sysctl. With --baseline DIR (what cluster-up recorded) chains,
# cgroups and sysctls are compared with their state before cluster-up; without it, no such chain
# or cgroup may exist and sysctls are not compared. Exits 1 and lists every leftover otherwise.
#
# Usage: hack/cluster-check-clean.sh [--baseline DIR]
set -euo pipefail

export LOG_NAME=check-clean
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

problems=()
problem() { problems+=("$*"); }

check_processes() {
  local pid exe
  while read -r pid exe; do
    [[ -n "${pid}" ]] && problem "process still running: pid ${pid} ${exe}"
  done < <(cluster_processes)
  return 0
}

check_mounts() {
  local mp
  while read -r mp; do
    [[ -n "${mp}" ]] && problem "still mounted: ${mp}"
  done < <(mounts_under "${RUN_DIR}" "${KUBELET_DIR}" "${PLUGIN_STATE_DIR}")
  return 0
}

check_network() {
  if ip link show "${CNI_BRIDGE}" >/dev/null 2>&1; then
    problem "bridge ${CNI_BRIDGE} still exists"
  fi
}

# check_plugin_state: no claim directory of the plugin and no claim CDI spec is left (the
# claims of the pods the cluster ran are never unprepared by a kubelet that is torn down).
check_plugin_state() {
  local path dir
  for path in "${PLUGIN_STATE_DIR}"/claims/*; do
    [[ -e "${path}" ]] && problem "plugin state left: ${path}"
  done
  for dir in "${CDI_DIRS[@]}"; do
    for path in "${dir}"/vgpu.dra.dev-claim_*.json; do
      [[ -e "${path}" ]] && problem "plugin state left: ${path}"
    done
  done
  return 0
}

# check_against_baseline NAME CURRENT_LINES BASELINE_FILE reports lines that are new since the
# baseline (every line when there is no baseline).
check_against_baseline() {
  local what="$1" current="$2" baseline_file="$3" line
  while read -r line; do
    [[ -n "${line}" ]] && problem "${what}: ${line}"
  done < <(comm -23 <(sort <<<"${current}") <(sort "${baseline_file}" 2>/dev/null || true))
  return 0
}

check_sysctls() {
  local baseline_file="$1" line name value now
  [[ -f "${baseline_file}" ]] || { log "no baseline: sysctls not compared"; return 0; }
  while IFS= read -r line; do
    name="${line%%=*}"
    value="${line#*=}"
    now="$(sysctl -n "${name}" 2>/dev/null | tr '\t' ' ')"
    [[ "${now}" == "${value}" ]] || problem "sysctl ${name} is ${now}, was ${value} before cluster-up"
  done <"${baseline_file}"
}

main() {
  local baseline=""
  if [[ "${1:-}" == "--baseline" ]]; then
    baseline="${2:?--baseline needs a directory}"
  elif [[ $# -gt 0 ]]; then
    die "usage: $0 [--baseline DIR]"
  fi
  require_root
  check_processes
  check_mounts
  check_plugin_state
  check_network
  check_against_baseline "iptables chain left" "$(cluster_chains)" "${baseline:+${baseline}/chains}"
  check_against_baseline "cgroup left" "$(kubepods_cgroups)" "${baseline:+${baseline}/cgroups}"
  check_sysctls "${baseline:+${baseline}/sysctls}"
  if (( ${#problems[@]} > 0 )); then
    printf '  %s\n' "${problems[@]}" >&2
    die "the machine is not clean: ${#problems[@]} leftover(s)"
  fi
  log "clean: no cluster process, mount, plugin claim state, bridge, iptables chain, kubepods cgroup or changed sysctl left"
}

main "$@"

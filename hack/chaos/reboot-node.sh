#!/usr/bin/env bash
# Fault injection for the chaos suite: a node "reboot" without rebooting the machine. As when
# the power is cut: the kubelet and containerd are SIGKILLed, and so is every container process
# (the plugin's among them) and every shim; then what a reboot loses goes — whatever lives in
# memory on a real node (tmpfs /run and /var/run, and every mount):
#   - containerd's state dir (its mounts: container root file systems, sandboxes' shm, network
#     namespaces), the shims' sockets and runc's state;
#   - the kubelet's mounts (its root's bind mount, pod volumes on tmpfs);
#   - the claims' tmpfs mounts under the plugin's state dir (the state dir itself stays: it is the
#     node's disk, shared as a systemd node shares every mount);
#   - our CDI specs in /var/run/cdi and the NRI socket;
#   - the kubepods cgroups.
# What is on disk stays: containerd's root (images, its metadata), the kubelet's root (its DRA
# checkpoint, pod directories), the plugin's checkpoint. Then containerd and the kubelet start
# again with the pods still bound to the node: the kubelet brings the plugin back, prepares the
# claims again and restarts the pods' containers. The boot ID does not change (the kernel keeps
# running), so the plugin cannot tell this from a crash of everything; it restores the claims'
# files either way.
#
# Usage: hack/chaos/reboot-node.sh
set -euo pipefail

export LOG_NAME=chaos-reboot
CHAOS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${CHAOS_DIR}/../lib/cluster.sh"
# shellcheck source=hack/lib/start.sh
source "${CHAOS_DIR}/../lib/start.sh"
# shellcheck source=hack/lib/teardown.sh
source "${CHAOS_DIR}/../lib/teardown.sh"

readonly CONTAINERD_STATE="${RUN_DIR}/containerd/state"
# Shim sockets (containerd's socket_dir) and runc's state for containerd's tasks.
readonly VOLATILE_RUNTIME_DIRS=("${RUN_DIR}/containerd/s" /run/containerd/s /run/containerd/runc)
readonly VOLATILE_CDI_DIR=/var/run/cdi

# kill_recorded NAME SIGKILLs a recorded cluster process and waits until it is gone.
kill_recorded() {
  local pid
  pid="$(recorded_pid "$1")" || { log "$1 was not running"; return 0; }
  log "SIGKILL $1 (pid ${pid})"
  kill -KILL "${pid}"
  while kill -0 "${pid}" 2>/dev/null; do sleep 0.05; done
}

# kill_container_processes SIGKILLs every process in the kubepods cgroups (every hierarchy) and
# every runc shim (by executable), until none is left. PIDs come from the kernel.
kill_container_processes() {
  local round pid exe cg left killed=0
  for round in $(seq 1 100); do
    left=0
    while read -r cg; do
      for pid in $(pids_in_cgroup "${cg}"); do
        kill -KILL "${pid}" 2>/dev/null && killed=$((killed + 1))
        left=1
      done
    done < <(kubepods_cgroups)
    while read -r pid exe; do
      [[ "${exe##*/}" == containerd-shim-runc-v2 ]] || continue
      kill -KILL "${pid}" 2>/dev/null && killed=$((killed + 1))
      left=1
    done < <(cluster_processes)
    if (( ! left )); then
      log "SIGKILLed ${killed} container and shim processes (${round} rounds)"
      return 0
    fi
    sleep 0.1
  done
  die "container processes survive SIGKILL"
}

# unmount_volatile unmounts, deepest first and in rounds (stacked mounts), every mount a reboot
# loses; see the top of this file.
unmount_volatile() {
  local round mp left count=0
  for round in 1 2 3 4 5; do
    left=0
    while read -r mp; do
      [[ -n "${mp}" ]] || continue
      left=1
      if umount "${mp}" 2>/dev/null || umount -l "${mp}" 2>/dev/null; then
        count=$((count + 1))
      else
        log "cannot unmount ${mp}"
      fi
    done < <(mounts_under "${CONTAINERD_STATE}" "${KUBELET_DIR}" "${PLUGIN_STATE_DIR}/claims")
    (( left )) || break
  done
  [[ -z "$(mounts_under "${CONTAINERD_STATE}" "${KUBELET_DIR}" "${PLUGIN_STATE_DIR}/claims")" ]] ||
    die "mounts survive the reboot: $(mounts_under "${CONTAINERD_STATE}" "${KUBELET_DIR}" "${PLUGIN_STATE_DIR}/claims" | tr '\n' ' ')"
  log "unmounted ${count} mounts"
}

# remove_volatile_files removes what lives on tmpfs on a real node. Never across a mount point:
# everything below was unmounted above.
remove_volatile_files() {
  local dir
  rm -rf --one-file-system "${CONTAINERD_STATE}"
  for dir in "${VOLATILE_RUNTIME_DIRS[@]}"; do
    rm -rf --one-file-system "${dir}"
  done
  rm -f "${VOLATILE_CDI_DIR}"/vgpu.dra.dev-claim_*.json "${VOLATILE_CDI_DIR}"/.vgpu.dra.dev-claim_*.tmp
  rm -f "${NRI_SOCKET}"
}

main() {
  local start=${SECONDS}
  require_root
  take_cluster_lock
  kill_recorded kubelet
  kill_recorded containerd
  kill_container_processes
  unmount_volatile
  remove_volatile_files
  remove_cgroups
  log "node is down; starting it again"
  start_containerd
  start_kubelet "$(node_ip)"
  log "node rebooted in $((SECONDS - start))s"
}

main "$@"

# shellcheck shell=bash
# Stops the local cluster and undoes what it changed on the machine. Sourced by cluster-down.sh
# and by cluster-up.sh (leftovers of a crashed cluster, and every failure path) after
# lib/cluster.sh. Every step is idempotent and tolerates a half-started cluster.
#
# What the kubelet and its runtime change on this VM, and therefore what is undone here, is listed
# in hack/README.md, "Facts of this project's machines", under "Pitfalls that cost hours".

# remove_pod_containers kills and deletes every container and sandbox through containerd while it
# still runs, so that the shims exit and release their mounts. The kubelet is already stopped and
# cannot restart them.
remove_pod_containers() {
  recorded_pid containerd >/dev/null || return 0
  local ids id
  ids="$(ctr_k8s tasks ls -q 2>/dev/null || true)"
  for id in ${ids}; do
    ctr_k8s tasks kill -a -s SIGKILL "${id}" >/dev/null 2>&1 || true
  done
  for id in ${ids}; do
    ctr_k8s tasks delete -f "${id}" >/dev/null 2>&1 || true
  done
  ids="$(ctr_k8s containers ls -q 2>/dev/null || true)"
  for id in ${ids}; do
    ctr_k8s containers delete "${id}" >/dev/null 2>&1 || true
  done
}

# stop_together NAME... signals the recorded processes together and waits until all are gone.
stop_together() {
  local name pid pids=() names=() stoppers=() i
  for name in "$@"; do
    if pid="$(recorded_pid "${name}")"; then
      pids+=("${pid}")
      names+=("${name}")
    fi
  done
  (( ${#pids[@]} > 0 )) || return 0
  log "stopping ${names[*]} (pids ${pids[*]})"
  for i in "${!pids[@]}"; do
    stop_pid "${pids[i]}" "${names[i]}" &
    stoppers+=("$!")
  done
  wait "${stoppers[@]}"
}

# stop_components stops the recorded processes: the kubelet first so that it restarts nothing,
# then the pods through containerd, then the rest together to save time, except etcd, which goes
# last: an API server whose etcd vanishes hangs in its graceful shutdown until SIGKILL.
stop_components() {
  local name others=()
  stop_together kubelet kube-proxy
  remove_pod_containers
  for name in "${COMPONENTS[@]}"; do
    [[ "${name}" == kubelet || "${name}" == kube-proxy || "${name}" == etcd ]] || others+=("${name}")
  done
  stop_together "${others[@]}"
  stop_together etcd
}

# pids_in_cgroup DIR prints every process in the cgroup DIR and its descendants.
pids_in_cgroup() {
  find "$1" -name cgroup.procs -exec cat {} + 2>/dev/null || true
}

# kill_leftover_processes kills what the recorded PIDs do not cover: containers whose shim died
# (found through their kubepods cgroups) and shims (found by executable; they daemonize, so they
# are not children of containerd). PIDs are taken from the kernel, never matched by name.
kill_leftover_processes() {
  local cg pid exe
  while read -r cg; do
    for pid in $(pids_in_cgroup "${cg}"); do
      log "killing leftover container process ${pid} in ${cg}"
      kill -KILL "${pid}" 2>/dev/null || true
    done
  done < <(kubepods_cgroups)
  while read -r pid exe; do
    [[ -n "${pid}" ]] || continue
    log "stopping leftover ${exe##*/} (pid ${pid})"
    stop_pid "${pid}" "${exe##*/}" 5
  done < <(cluster_processes)
}

# unmount_all unmounts everything below the run dir, the kubelet root and the plugin's state dir,
# deepest first: pod volumes (tmpfs), overlay rootfs, sandbox shm, netns bind mounts, claims'
# tmpfs, and the kubelet root, which
# the kubelet bind-mounts onto itself (possibly more than once after restarts, hence the rounds).
unmount_all() {
  local round mp left
  for round in 1 2 3 4 5; do
    left=0
    while read -r mp; do
      [[ -n "${mp}" ]] || continue
      left=1
      umount "${mp}" 2>/dev/null || umount -l "${mp}" 2>/dev/null || log "cannot unmount ${mp}"
    done < <(mounts_under "${RUN_DIR}" "${KUBELET_DIR}" "${PLUGIN_STATE_DIR}")
    (( left )) || return 0
    (( round < 5 )) && sleep 0.2
  done
}

# delete_bridge removes the CNI bridge and any veth still attached to it (normally a veth goes
# away with its pod's network namespace once that is unmounted and empty).
delete_bridge() {
  local veth
  ip link show "${CNI_BRIDGE}" >/dev/null 2>&1 || return 0
  for veth in $(ip -o link show master "${CNI_BRIDGE}" 2>/dev/null | awk -F': ' '{ sub("@.*", "", $2); print $2 }'); do
    ip link delete "${veth}" 2>/dev/null || true
  done
  log "deleting bridge ${CNI_BRIDGE}"
  ip link delete "${CNI_BRIDGE}"
}

# chain_deletion_script TOOL TABLE CHAIN... prints an iptables-restore script that first deletes
# every rule of other chains (built-in ones such as INPUT and POSTROUTING included) that jumps to
# one of CHAINs, then flushes and deletes CHAINs.
chain_deletion_script() {
  local tool="$1" table="$2" chain
  shift 2
  echo "*${table}"
  "${tool}" -w 5 -t "${table}" -S | awk -v doomed="$*" '
    BEGIN { n = split(doomed, list, " "); for (i = 1; i <= n; i++) gone[list[i]] = 1 }
    $1 == "-A" && !($2 in gone) {
      for (i = 3; i < NF; i++) if (($i == "-j" || $i == "-g") && ($(i + 1) in gone)) { sub(/^-A /, "-D "); print; break }
    }'
  for chain in "$@"; do echo "-F ${chain}"; done
  for chain in "$@"; do echo "-X ${chain}"; done
  echo "COMMIT"
}

# delete_chains removes the KUBE-* and CNI-* chains that did not exist before cluster-up, one
# iptables-restore transaction per table (one iptables call per rule takes seconds here).
delete_chains() {
  local baseline="${BASELINE_DIR}/chains" new tool table chains
  new="$(cluster_chains | sort | comm -23 - <(sort "${baseline}" 2>/dev/null || true))"
  [[ -n "${new}" ]] || return 0
  log "deleting $(wc -l <<<"${new}") iptables chains"
  for tool in iptables ip6tables; do
    for table in "${IPTABLES_TABLES[@]}"; do
      chains="$(awk -v tool="${tool}" -v table="${table}" '$1 == tool && $2 == table { print $3 }' <<<"${new}")"
      [[ -n "${chains}" ]] || continue
      # shellcheck disable=SC2086 # one argument per chain name.
      chain_deletion_script "${tool}" "${table}" ${chains} | "${tool}-restore" -w 5 --noflush ||
        log "cannot delete ${tool} ${table} chains: ${chains//$'\n'/ }"
    done
  done
}

# remove_cgroups removes the kubepods trees the kubelet and runc created, in every hierarchy,
# deepest first (a cgroup is removed with rmdir once it has no processes and no children).
remove_cgroups() {
  local cg
  while read -r cg; do
    if grep -qxF "${cg}" "${BASELINE_DIR}/cgroups" 2>/dev/null; then
      continue
    fi
    find "${cg}" -depth -type d -exec rmdir {} + 2>/dev/null || true
    [[ -d "${cg}" ]] && log "cannot remove cgroup ${cg}"
  done < <(kubepods_cgroups)
  return 0
}

# restore_sysctls puts back every watched sysctl that differs from its value before cluster-up.
restore_sysctls() {
  local line name value
  [[ -f "${BASELINE_DIR}/sysctls" ]] || return 0
  while IFS= read -r line; do
    name="${line%%=*}"
    value="${line#*=}"
    if [[ "$(sysctl -n "${name}" 2>/dev/null | tr '\t' ' ')" != "${value}" ]]; then
      log "restoring ${name}=${value}"
      sysctl -q -w "${name}=${value}" >/dev/null || log "cannot restore ${name}"
    fi
  done <"${BASELINE_DIR}/sysctls"
}

# remove_created_dirs deletes the host directories that cluster-up found missing (kubelet root,
# /var/log/pods, the CNI cache ...). Never across a mount point: everything was unmounted above,
# and --one-file-system guards against a mount that would not go.
remove_created_dirs() {
  local dir
  [[ -f "${BASELINE_DIR}/created-dirs" ]] || return 0
  while read -r dir; do
    [[ -n "${dir}" && -e "${dir}" ]] || continue
    if [[ -n "$(mounts_under "${dir}")" ]]; then
      log "not removing ${dir}: something is still mounted below it"
      continue
    fi
    rm -rf --one-file-system "${dir}"
  done <"${BASELINE_DIR}/created-dirs"
}

# remove_plugin_state removes what the plugin left for the pods the cluster ran: claim
# directories (their tmpfs is unmounted above) and the claims' CDI specs. The kubelet never
# unprepares the claims of a cluster that is torn down under its pods. The state dir itself, the
# installed library and the registry socket dir are left to remove_created_dirs.
remove_plugin_state() {
  local dir
  if [[ -d "${PLUGIN_STATE_DIR}/claims" && -z "$(mounts_under "${PLUGIN_STATE_DIR}/claims")" ]]; then
    rm -rf --one-file-system "${PLUGIN_STATE_DIR}/claims"
  fi
  for dir in "${CDI_DIRS[@]}"; do
    rm -f "${dir}"/vgpu.dra.dev-claim_*.json "${dir}"/.vgpu.dra.dev-claim_*.tmp
  done
}

# save_logs keeps the components' logs of this cluster in _output/cluster/logs.
save_logs() {
  [[ -d "${LOG_DIR}" ]] || return 0
  rm -rf "${SAVED_LOG_DIR}"
  mkdir -p "$(dirname "${SAVED_LOG_DIR}")"
  cp -r "${LOG_DIR}" "${SAVED_LOG_DIR}"
}

# teardown_cluster undoes cluster-up; RUN_DIR itself (with the baseline) is removed by the caller
# once cluster-check-clean.sh has compared the machine against the baseline.
teardown_cluster() {
  stop_components
  kill_leftover_processes
  unmount_all
  delete_bridge
  delete_chains
  remove_cgroups
  restore_sysctls
  remove_plugin_state
  remove_created_dirs
  save_logs
}

# remove_run_dir deletes RUN_DIR once nothing is mounted below it.
remove_run_dir() {
  [[ -d "${RUN_DIR}" ]] || return 0
  if [[ -n "$(mounts_under "${RUN_DIR}")" ]]; then
    die "not removing ${RUN_DIR}: mounts remain below it"
  fi
  rm -rf --one-file-system "${RUN_DIR}"
}

# shellcheck shell=bash
# Starting cluster components: shared by cluster-up.sh and the fault-injection scripts of the
# e2e and chaos suites (cluster-restart-containerd.sh, cluster-restart-kubelet.sh, hack/chaos/).
# Sourced after lib/cluster.sh.

# How long one component may take to become healthy on a loaded two-core machine.
STARTUP_TIMEOUT_S="${VGPU_DRA_STARTUP_TIMEOUT_S:-120}"

# start_component NAME ARGS... starts a cluster binary detached from this script (own session,
# neither lock's descriptor: fd 8, the suite lock, and fd 9, the cluster lock, are closed, or the
# daemon would hold the lock for as long as the cluster runs; output in LOG_DIR/NAME.log) and records its PID with the executable it must run.
start_component() {
  local name="$1" exe
  shift
  exe="$(readlink -f "${CLUSTER_BIN}/${name}")"
  setsid "${exe}" "$@" >>"${LOG_DIR}/${name}.log" 2>&1 </dev/null 8>&- 9>&- &
  local pid=$! tries=0
  echo "${pid} ${exe}" >"$(pid_file "${name}")"
  # Until setsid has exec'd, /proc/PID/exe is setsid and recorded_pid would call it gone.
  until [[ "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "${exe}" ]]; do
    kill -0 "${pid}" 2>/dev/null || break # exited: wait_until reports it with its log
    (( ++tries < 200 )) || break
    sleep 0.05
  done
  log "started ${name} (pid ${pid}, log ${LOG_DIR}/${name}.log)"
}

# wait_until NAME WHAT CHECK... retries CHECK until it succeeds, failing early with NAME's log
# when NAME's process has exited; WHAT says what became true.
wait_until() {
  local name="$1" what="$2" start=${SECONDS}
  shift 2
  until "$@" >/dev/null 2>&1; do
    if ! recorded_pid "${name}" >/dev/null; then
      tail -n 30 "${LOG_DIR}/${name}.log" >&2 || true
      die "${name} exited during start-up (log: ${LOG_DIR}/${name}.log)"
    fi
    if (( SECONDS - start > STARTUP_TIMEOUT_S )); then
      tail -n 30 "${LOG_DIR}/${name}.log" >&2 || true
      die "not true after ${STARTUP_TIMEOUT_S}s: ${what} (log: ${LOG_DIR}/${name}.log)"
    fi
    sleep 0.3
  done
  log "${what} ($((SECONDS - start))s)"
}

start_containerd() {
  start_component containerd --config "${CONFIG_DIR}/containerd.toml"
  wait_until containerd "containerd is serving" "${CLUSTER_BIN}/ctr" -a "${CONTAINERD_SOCKET}" version
}

# node_ready: the API server reports the node Ready.
node_ready() {
  [[ "$(kubectl_admin get node "${NODE_NAME}" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}

# start_kubelet IP starts the kubelet with the configuration cluster-up wrote and waits until it
# is healthy and its node Ready.
start_kubelet() {
  local ip="$1"
  mkdir -p "${KUBELET_DIR}"
  start_component kubelet --config "${CONFIG_DIR}/kubelet.yaml" \
    --kubeconfig "${CONFIG_DIR}/kubelet.kubeconfig" --root-dir "${KUBELET_DIR}" \
    --hostname-override "${NODE_NAME}" --node-ip "${ip}" --v=2
  wait_until kubelet "kubelet is healthy" curl -fsS --max-time 3 "http://127.0.0.1:${KUBELET_HEALTHZ_PORT}/healthz"
  wait_until kubelet "node ${NODE_NAME} is Ready" node_ready
}

#!/usr/bin/env bash
# Starts a single-node Kubernetes cluster on this machine as plain processes (there is no Docker
# engine, so kind cannot run): etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# containerd with NRI and CDI, the kubelet and kube-proxy. Waits for the node to be Ready and
# prints the kubeconfig path.
#
# Idempotent: a healthy cluster is left as it is; the leftovers of a crashed one are torn down
# first. Any failure tears down what was started (hack/cluster-down.sh does the same on demand).
#
# Binaries: hack/build-cluster-bins.sh (make cluster-bins). Images: hack/images.sh.
# Usage, and the measured facts and pitfalls of these machines: hack/README.md.
set -euo pipefail

export LOG_NAME=cluster-up
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"
# shellcheck source=hack/lib/pki.sh
source "${HACK_DIR}/lib/pki.sh"
# shellcheck source=hack/lib/configs.sh
source "${HACK_DIR}/lib/configs.sh"
# shellcheck source=hack/lib/teardown.sh
source "${HACK_DIR}/lib/teardown.sh"
# shellcheck source=hack/lib/start.sh
source "${HACK_DIR}/lib/start.sh"

# Host directories the cluster may create; those missing before cluster-up are removed by
# cluster-down. Shims put their sockets under /run/containerd/s whatever the state dir is; libcni
# caches results under /var/lib/cni; the kubelet writes /var/log/pods and /var/log/containers.
readonly HOST_DIRS_THE_CLUSTER_MAY_CREATE=("${KUBELET_DIR}" /var/log/pods /var/log/containers
  /var/lib/cni /run/containerd "$(dirname "${NRI_SOCKET}")" "${CDI_DIRS[@]}" "${PLUGIN_STATE_DIR}")

check_prerequisites() {
  local bin missing=() port
  "${HACK_DIR}/install-cluster-deps.sh"
  for bin in etcd kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy \
    containerd containerd-shim-runc-v2 ctr; do
    [[ -x "${CLUSTER_BIN}/${bin}" ]] || missing+=("${bin}")
  done
  (( ${#missing[@]} == 0 )) ||
    die "missing ${missing[*]} in ${CLUSTER_BIN}: run 'make cluster-bins' (hack/build-cluster-bins.sh)"
  for bin in runc openssl iptables ip6tables ip curl flock setsid; do
    command -v "${bin}" >/dev/null || die "${bin} not found (apt-get install runc openssl iptables iproute2 curl util-linux)"
  done
  [[ -x "${CNI_BIN_DIR}/bridge" && -x "${CNI_BIN_DIR}/host-local" && -x "${CNI_BIN_DIR}/loopback" ]] ||
    die "CNI plugins missing in ${CNI_BIN_DIR}: apt-get install containernetworking-plugins"
  for port in "${CLUSTER_PORTS[@]}"; do
    if [[ -n "$(ss -Htln "sport = :${port}" 2>/dev/null)" ]]; then
      die "port ${port} is already in use (another cluster?): $(ss -Htlnp "sport = :${port}" | head -1)"
    fi
  done
}

# record_baseline writes what cluster-down restores and cluster-check-clean.sh compares against.
record_baseline() {
  local dir
  mkdir -p "${BASELINE_DIR}"
  sysctl_snapshot >"${BASELINE_DIR}/sysctls"
  cluster_chains | sort >"${BASELINE_DIR}/chains"
  kubepods_cgroups >"${BASELINE_DIR}/cgroups"
  : >"${BASELINE_DIR}/created-dirs"
  for dir in "${HOST_DIRS_THE_CLUSTER_MAY_CREATE[@]}"; do
    [[ -e "${dir}" ]] || echo "${dir}" >>"${BASELINE_DIR}/created-dirs"
  done
}

https_ok() { curl -fsS --max-time 3 --cacert "${PKI_DIR}/ca.crt" --cert "${PKI_DIR}/admin.crt" --key "${PKI_DIR}/admin.key" "$1"; }
# The controller-manager and scheduler serve healthz with a self-signed certificate.
local_healthz_ok() { curl -fsSk --max-time 3 "https://127.0.0.1:$1/healthz"; }

start_etcd() {
  mkdir -p "${RUN_DIR}/etcd"
  # --unsafe-no-fsync: a throwaway test cluster on a disk shared with parallel builds.
  start_component etcd --name vgd --data-dir "${RUN_DIR}/etcd" \
    --listen-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --advertise-client-urls "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --listen-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls "http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster "vgd=http://127.0.0.1:${ETCD_PEER_PORT}" \
    --unsafe-no-fsync --log-level warn
  wait_until etcd "etcd is healthy" curl -fsS --max-time 3 "http://127.0.0.1:${ETCD_CLIENT_PORT}/health"
}

start_apiserver() {
  local ip="$1"
  # DRA (resource.k8s.io/v1) is on by default in 1.37: no feature gates or runtime-config.
  # The kubelet serves on the node IP only; the node's hostname may resolve to loopback
  # (/etc/hosts), hence InternalIP first for exec, logs and port-forward.
  start_component kube-apiserver \
    --etcd-servers "http://127.0.0.1:${ETCD_CLIENT_PORT}" \
    --advertise-address "${ip}" --secure-port "${APISERVER_PORT}" \
    --tls-cert-file "${PKI_DIR}/apiserver.crt" --tls-private-key-file "${PKI_DIR}/apiserver.key" \
    --client-ca-file "${PKI_DIR}/ca.crt" \
    --kubelet-client-certificate "${PKI_DIR}/apiserver-kubelet-client.crt" \
    --kubelet-client-key "${PKI_DIR}/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types InternalIP,Hostname \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "${PKI_DIR}/service-account.pub" \
    --service-account-signing-key-file "${PKI_DIR}/service-account.key" \
    --service-cluster-ip-range "${SERVICE_CIDR}" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
    --allow-privileged=true --profiling=false
  wait_until kube-apiserver "kube-apiserver is ready" https_ok "https://127.0.0.1:${APISERVER_PORT}/readyz"
}

start_controllers() {
  start_component kube-controller-manager \
    --kubeconfig "${CONFIG_DIR}/controller-manager.kubeconfig" \
    --authentication-kubeconfig "${CONFIG_DIR}/controller-manager.kubeconfig" \
    --authorization-kubeconfig "${CONFIG_DIR}/controller-manager.kubeconfig" \
    --service-account-private-key-file "${PKI_DIR}/service-account.key" \
    --root-ca-file "${PKI_DIR}/ca.crt" \
    --cluster-signing-cert-file "${PKI_DIR}/ca.crt" --cluster-signing-key-file "${PKI_DIR}/ca.key" \
    --use-service-account-credentials=true --leader-elect=false \
    --bind-address 127.0.0.1 --secure-port "${CONTROLLER_MANAGER_PORT}" --profiling=false
  start_component kube-scheduler \
    --kubeconfig "${CONFIG_DIR}/scheduler.kubeconfig" \
    --authentication-kubeconfig "${CONFIG_DIR}/scheduler.kubeconfig" \
    --authorization-kubeconfig "${CONFIG_DIR}/scheduler.kubeconfig" \
    --leader-elect=false --bind-address 127.0.0.1 --secure-port "${SCHEDULER_PORT}" --profiling=false
  wait_until kube-controller-manager "kube-controller-manager is healthy" local_healthz_ok "${CONTROLLER_MANAGER_PORT}"
  wait_until kube-scheduler "kube-scheduler is healthy" local_healthz_ok "${SCHEDULER_PORT}"
}

start_kube_proxy() {
  start_component kube-proxy --config "${CONFIG_DIR}/kube-proxy.yaml"
  wait_until kube-proxy "kube-proxy is healthy" curl -fsS --max-time 3 "http://127.0.0.1:${KUBE_PROXY_HEALTHZ_PORT}/healthz"
}

# Pods in the default namespace need its service account, which a controller creates.
wait_default_service_account() {
  wait_until kube-controller-manager "default service account exists" kubectl_admin -n default get serviceaccount default
}

cluster_is_healthy() {
  local name
  [[ -f "${KUBECONFIG_ADMIN}" ]] || return 1
  for name in "${COMPONENTS[@]}"; do
    recorded_pid "${name}" >/dev/null || return 1
  done
  node_ready 2>/dev/null
}

on_failure() {
  local rc=$?
  trap - EXIT
  log "start-up failed (exit ${rc}): tearing down what was started; logs are kept in ${SAVED_LOG_DIR}"
  teardown_cluster || true
  "${HACK_DIR}/cluster-check-clean.sh" --baseline "${BASELINE_DIR}" || true
  remove_run_dir || true
  exit "${rc}"
}

main() {
  local start=${SECONDS} ip
  require_root
  take_cluster_lock
  if cluster_is_healthy; then
    log "cluster is already up"
    echo "export KUBECONFIG=${KUBECONFIG_ADMIN}"
    return 0
  fi
  check_prerequisites_or_leftovers
  ip="$(node_ip)"
  mkdir -p "${PID_DIR}" "${LOG_DIR}" "${CONFIG_DIR}"
  record_baseline
  trap on_failure EXIT

  make_pki "${ip}"
  write_containerd_config
  write_cni_config
  write_kubelet_config "${ip}"
  write_kube_proxy_config "${ip}"

  share_plugin_state_dir

  start_etcd
  start_apiserver "${ip}"
  start_controllers
  start_containerd
  # The pause image must be in containerd before the kubelet creates the first sandbox.
  LOG_NAME=images "${HACK_DIR}/images.sh" base
  start_kubelet "${ip}"
  start_kube_proxy
  wait_default_service_account
  trap - EXIT

  log "cluster up in $(format_duration $((SECONDS - start))); node ${NODE_NAME} is Ready"
  log "stop it with: make cluster-down"
  echo "export KUBECONFIG=${KUBECONFIG_ADMIN}"
}

# share_plugin_state_dir makes the plugin's state dir a shared mount, as every directory is on a
# systemd node (where / is mounted shared): the plugin mounts a tmpfs per claim below it with
# Bidirectional propagation, which containerd refuses on a private mount ("is not a shared
# mount"); this machine's / is private. cluster-down unmounts it like every mount it made.
#
# With VGPU_DRA_STATE_DIR_SIZE (the chaos suite) the state dir is a file system of its own of
# that size instead (a tmpfs with STATE_DIR_INODES inodes), standing for a small disk partition:
# the suite fills it to see Prepare fail cleanly. The plugin must find it there before it starts.
readonly STATE_DIR_INODES=4096
share_plugin_state_dir() {
  mkdir -p "${PLUGIN_STATE_DIR}"
  if [[ -n "${VGPU_DRA_STATE_DIR_SIZE:-}" ]]; then
    mount -t tmpfs -o "size=${VGPU_DRA_STATE_DIR_SIZE},nr_inodes=${STATE_DIR_INODES},mode=0755" \
      vgd-state "${PLUGIN_STATE_DIR}"
    log "the plugin's state dir is a ${VGPU_DRA_STATE_DIR_SIZE} tmpfs (${STATE_DIR_INODES} inodes)"
  else
    mount --bind "${PLUGIN_STATE_DIR}" "${PLUGIN_STATE_DIR}"
  fi
  mount --make-rshared "${PLUGIN_STATE_DIR}"
}

# check_prerequisites_or_leftovers tears down a crashed cluster's leftovers (its baseline still
# tells what to restore) before checking that ports and binaries are available.
check_prerequisites_or_leftovers() {
  if [[ -d "${RUN_DIR}" ]] || [[ -n "$(cluster_processes)" ]]; then
    log "found leftovers of an earlier cluster in ${RUN_DIR}: tearing them down first"
    teardown_cluster
    remove_run_dir
  fi
  check_prerequisites
}

main "$@"

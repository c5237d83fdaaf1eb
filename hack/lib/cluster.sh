# shellcheck shell=bash disable=SC2034 # constants used by the scripts that source this file
# Shared by the local cluster scripts (cluster-up.sh, cluster-down.sh, cluster-check-clean.sh,
# images.sh): the one place that knows the cluster's paths, ports and names. Sourced, not run.
#
# Measured facts and pitfalls behind these choices: hack/README.md, "Facts of this project's
# machines".

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
readonly REPO_ROOT

# Everything the cluster writes lives under RUN_DIR, except the paths the vgpu-dra plugin and its
# chart expect at their standard places (kubelet root, NRI socket, CDI dir). Kept short: unix
# socket paths must stay under ~100 bytes (sun_path).
readonly RUN_DIR="${VGPU_DRA_CLUSTER_DIR:-/run/vgd}"
readonly KUBELET_DIR="/var/lib/kubelet"
readonly NRI_SOCKET="/var/run/nri/nri.sock"
readonly CDI_DIRS=(/etc/cdi /var/run/cdi)
# The plugin's state dir (the chart's stateDir): the plugin mounts a tmpfs per prepared claim
# below it, which outlives the plugin's pod.
readonly PLUGIN_STATE_DIR="/var/lib/vgpu-dra"
# Held with flock while a script changes the cluster, so two runs never interleave. Outside
# RUN_DIR because cluster-down removes RUN_DIR.
readonly LOCK_FILE="/run/lock/vgd-cluster.lock"

readonly CLUSTER_BIN="${REPO_ROOT}/_output/cluster/bin"
readonly CLUSTER_CACHE="${VGPU_DRA_CACHE:-/var/cache/vgpu-dra}"
readonly PKI_DIR="${RUN_DIR}/pki"
readonly PID_DIR="${RUN_DIR}/pids"
readonly LOG_DIR="${RUN_DIR}/logs"
readonly BASELINE_DIR="${RUN_DIR}/baseline"
readonly CONFIG_DIR="${RUN_DIR}/config"
readonly CONTAINERD_SOCKET="${RUN_DIR}/containerd/containerd.sock"
readonly CNI_CONF_DIR="${RUN_DIR}/cni/net.d"
readonly CNI_BIN_DIR="/usr/lib/cni"
readonly KUBECONFIG_ADMIN="${RUN_DIR}/admin.kubeconfig"
# Logs of the last cluster, kept per clone after cluster-down removes RUN_DIR.
readonly SAVED_LOG_DIR="${REPO_ROOT}/_output/cluster/logs"

readonly NODE_NAME="${VGPU_DRA_NODE_NAME:-$(hostname | tr '[:upper:]' '[:lower:]')}"
readonly SERVICE_CIDR="10.96.0.0/24"
readonly SERVICE_KUBERNETES_IP="10.96.0.1"
readonly POD_CIDR="10.244.0.0/24"
# Our own bridge name, so that nothing else's cni0 is touched.
readonly CNI_BRIDGE="vgd0"
readonly ETCD_CLIENT_PORT=2379
readonly ETCD_PEER_PORT=2380
readonly APISERVER_PORT=6443
readonly KUBELET_PORT=10250
readonly KUBELET_HEALTHZ_PORT=10248
readonly CONTROLLER_MANAGER_PORT=10257
readonly SCHEDULER_PORT=10259
readonly KUBE_PROXY_METRICS_PORT=10249
readonly KUBE_PROXY_HEALTHZ_PORT=10256
readonly CLUSTER_PORTS=("${ETCD_CLIENT_PORT}" "${ETCD_PEER_PORT}" "${APISERVER_PORT}" "${KUBELET_PORT}"
  "${KUBELET_HEALTHZ_PORT}" "${CONTROLLER_MANAGER_PORT}" "${SCHEDULER_PORT}"
  "${KUBE_PROXY_METRICS_PORT}" "${KUBE_PROXY_HEALTHZ_PORT}")

# Processes in start order; they are stopped in reverse.
readonly COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler containerd kubelet kube-proxy)

# Image names (the kubelet and containerd qualify them with docker.io/).
readonly PAUSE_IMAGE="docker.io/vgpu-dra/pause:dev"
readonly TEST_WORKLOAD_IMAGE="docker.io/vgpu-dra/test-workload:dev"
readonly PLUGIN_IMAGE="docker.io/vgpu-dra/vgpu-dra:dev"

# Kernel settings that the kubelet (kernel tunables it insists on), the bridge CNI plugin
# (ip_forward) and kube-proxy change. Recorded before cluster-up and restored by cluster-down.
readonly WATCHED_SYSCTLS=(
  vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes
  net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv6.conf.all.forwarding
  net.ipv4.conf.all.route_localnet
  net.netfilter.nf_conntrack_max net.netfilter.nf_conntrack_tcp_timeout_established
  net.netfilter.nf_conntrack_tcp_timeout_close_wait net.netfilter.nf_conntrack_tcp_be_liberal
  net.bridge.bridge-nf-call-iptables net.bridge.bridge-nf-call-ip6tables
)
# Chains whose names these prefixes start are created by the kubelet, kube-proxy or CNI plugins.
readonly CHAIN_PATTERN='^(KUBE-|CNI-)'
readonly IPTABLES_TABLES=(filter nat mangle raw)

# kubectl_admin and ctr_k8s run the cluster's own kubectl (as cluster-admin) and ctr (in the CRI
# namespace; ctr needs the socket's absolute path).
kubectl_admin() { "${CLUSTER_BIN}/kubectl" --kubeconfig "${KUBECONFIG_ADMIN}" "$@"; }
ctr_k8s() { "${CLUSTER_BIN}/ctr" -a "${CONTAINERD_SOCKET}" -n k8s.io "$@"; }

log() { printf '[%s %s] %s\n' "${LOG_NAME:-cluster}" "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# format_duration 125 -> "2m05s"
format_duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# take_suite_lock serialises whole runs that bring a cluster up, use it and take it down (make e2e,
# make chaos, make demo), so that two clones on one machine (a developer's and CI's) never share
# or tear down each other's cluster. It waits as long as the other run takes (fd 8, held until
# this script exits; start_component closes it for the daemons). A cluster daemon that holds it
# (one started by a checkout from before that fix) would make every later suite wait forever:
# that is refused at once, with the way out.
SUITE_LOCK="${VGPU_DRA_CACHE:-/var/cache/vgpu-dra}/suite.lock"
take_suite_lock() {
  local holders
  mkdir -p "$(dirname "${SUITE_LOCK}")"
  exec 8>"${SUITE_LOCK}"
  flock -n 8 && return 0
  holders="$(lock_holders "${SUITE_LOCK}")"
  if grep -q ' cluster$' <<<"${holders}"; then
    die "the suite lock ${SUITE_LOCK} is held by a daemon of the running cluster ($(awk '$3 == "cluster" {printf "%s pid %s ", $2, $1}' <<<"${holders}")); it never lets go: run make cluster-down first"
  fi
  log "another cluster suite runs on this machine; waiting for it (${SUITE_LOCK}; held by: $(awk '{printf "%s pid %s ", $2, $1}' <<<"${holders}"))"
  flock 8
}

# lock_holders FILE prints "PID COMM cluster|other" for every other process with FILE open:
# "cluster" when it runs one of the cluster's binaries (a daemon, which never lets go).
lock_holders() {
  local fd pid exe
  for fd in /proc/[0-9]*/fd/*; do
    [[ "$(readlink "${fd}" 2>/dev/null)" == "$1" ]] || continue
    pid="${fd#/proc/}"
    pid="${pid%%/*}"
    [[ "${pid}" == "$$" || "${pid}" == "${BASHPID}" ]] && continue
    exe="$(readlink "/proc/${pid}/exe" 2>/dev/null)" || continue
    if [[ "${exe}" == "${CLUSTER_CACHE}/bin/"* ]]; then
      echo "${pid} $(cat "/proc/${pid}/comm" 2>/dev/null) cluster"
    else
      echo "${pid} $(cat "/proc/${pid}/comm" 2>/dev/null) other"
    fi
  done | sort -un
}

# take_down_cluster_left_up SUITE: a suite that holds the suite lock and finds a cluster up (make
# demo leaves its cluster up; so does make cluster-up by hand) takes it down before it brings up
# its own: the cluster left up has another chart release, other settings and other pods.
take_down_cluster_left_up() {
  [[ -d "${RUN_DIR}" ]] || return 0
  log "a cluster is up (make demo?); $1 needs a cluster of its own: taking it down first"
  make -C "${REPO_ROOT}" --no-print-directory cluster-down
}

# take_cluster_lock serialises cluster scripts on this machine (fd 9; started daemons close it).
take_cluster_lock() {
  mkdir -p "$(dirname "${LOCK_FILE}")"
  exec 9>"${LOCK_FILE}"
  if ! flock -w 600 9; then
    die "another cluster script holds ${LOCK_FILE} for more than 10 minutes"
  fi
}

require_root() {
  [[ ${EUID} -eq 0 ]] || die "the local cluster needs root (mounts, cgroups, iptables)"
}

# node_ip is the address the API server advertises (the endpoint of the kubernetes service, which
# pods reach through kube-proxy) and the kubelet registers: the source address of the default
# route, so that pods on the bridge can reach it.
node_ip() {
  local ip
  ip="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
  if [[ -z "${ip}" ]]; then
    ip="$(ip -4 -o addr show scope global | awk '{sub("/.*", "", $4); print $4; exit}')"
  fi
  [[ -n "${ip}" ]] || die "cannot find this machine's IPv4 address"
  echo "${ip}"
}

# --- processes -------------------------------------------------------------------------------
# Each started process is recorded as "PID EXE" in PID_DIR/NAME.pid. The executable is checked
# before a signal is sent, so a PID reused after a crash or reboot is never killed by mistake.

pid_file() { echo "${PID_DIR}/$1.pid"; }

# recorded_pid NAME prints the PID of NAME if it is still the process we started.
recorded_pid() {
  local file pid exe
  file="$(pid_file "$1")"
  [[ -f "${file}" ]] || return 1
  read -r pid exe <"${file}" || return 1
  [[ -n "${pid}" && "$(readlink "/proc/${pid}/exe" 2>/dev/null)" == "${exe}" ]] || return 1
  echo "${pid}"
}

# stop_pid PID LABEL [TIMEOUT_S]: SIGTERM, then SIGKILL after the timeout.
stop_pid() {
  local pid="$1" label="$2" timeout="${3:-15}" waited=0
  kill -TERM "${pid}" 2>/dev/null || return 0
  while kill -0 "${pid}" 2>/dev/null; do
    if (( waited >= timeout * 10 )); then
      log "${label} (pid ${pid}) ignored SIGTERM for ${timeout}s: SIGKILL"
      kill -KILL "${pid}" 2>/dev/null || true
      sleep 0.2
      return 0
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
}

# --- state checks shared by cluster-down and cluster-check-clean ------------------------------

# mounts_under DIR... lists mount points at or below the given directories, deepest first.
# Reads mountinfo directly: findmnt would unescape nothing differently, but is not always there.
mounts_under() {
  local dir
  for dir in "$@"; do
    awk -v d="${dir}" '{ mp = $5; gsub(/\\040/, " ", mp); if (mp == d || index(mp, d "/") == 1) print mp }' \
      /proc/self/mountinfo
  done | awk '{ print length($0) "\t" $0 }' | sort -rn | cut -f2-
}

# chains_of TOOL TABLE lists the KUBE-* and CNI-* chains of one table ("TABLE CHAIN" lines).
chains_of() {
  local tool="$1" table="$2"
  command -v "${tool}" >/dev/null || return 0
  "${tool}" -w 5 -t "${table}" -S 2>/dev/null | awk -v t="${table}" '$1 == "-N" { print t, $2 }' |
    grep -E " ${CHAIN_PATTERN#^}" || true
}

# cluster_chains prints every KUBE-*/CNI-* chain as "TOOL TABLE CHAIN".
cluster_chains() {
  local tool table
  for tool in iptables ip6tables; do
    for table in "${IPTABLES_TABLES[@]}"; do
      chains_of "${tool}" "${table}" | sed "s/^/${tool} /"
    done
  done
}

# sysctl_snapshot prints "name=value" for every watched sysctl this kernel has.
sysctl_snapshot() {
  local name value
  for name in "${WATCHED_SYSCTLS[@]}"; do
    if value="$(sysctl -n "${name}" 2>/dev/null)"; then
      printf '%s=%s\n' "${name}" "${value//$'\t'/ }"
    fi
  done
}

# cgroup_hierarchies lists the mounted cgroup hierarchies (v1 controllers and the v2 unified
# one): with cgroupfs on this hybrid VM the kubelet and runc create kubepods in each of them.
cgroup_hierarchies() {
  awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/self/mounts | sort -u
}

# kubepods_cgroups lists the kubepods cgroup directories in every hierarchy.
kubepods_cgroups() {
  local h
  while read -r h; do
    [[ -d "${h}/kubepods" ]] && echo "${h}/kubepods"
  done < <(cgroup_hierarchies)
  return 0
}

# cluster_processes lists "PID EXE" of every process running one of the cluster's binaries
# (those under the machine cache, which is where _output/cluster/bin links point). One find over
# /proc instead of a readlink per process: the machine runs hundreds of compiler processes.
cluster_processes() {
  local link pid exe
  while read -r link; do
    pid="${link#/proc/}"
    pid="${pid%/exe}"
    exe="$(readlink "${link}" 2>/dev/null)" || continue
    echo "${pid} ${exe}"
  done < <(find /proc -mindepth 2 -maxdepth 2 -name exe -lname "${CLUSTER_CACHE}/bin/*" 2>/dev/null)
}

#!/usr/bin/env bash
# Proves that the local cluster (hack/cluster-up.sh) runs pods the way the e2e suite needs:
#   1. a pod on the pod network (CNI bridge) with the test workload image becomes Running, and
#      `kubectl exec` into it works; from inside, the kubernetes service VIP reaches the API
#      server (kube-proxy), as the plugin's in-cluster client will;
#   2. a hostNetwork pod becomes Running;
#   3. a container carrying the required-plugins annotation (docs/design/contract.md §1) is
#      refused by containerd's NRI default validator while no such NRI plugin is connected.
# Prints how long each pod took to become Running. Deletes its pods on exit.
set -euo pipefail

export LOG_NAME=smoke
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

readonly NAMESPACE=vgd-smoke
# Default: the driver name of docs/design/contract.md §1; any absent plugin name proves the same.
readonly REQUIRED_PLUGIN="${REQUIRED_PLUGIN:-vgpu.dra.dev}"

cleanup() {
  kubectl_admin delete namespace "${NAMESPACE}" --wait=false >/dev/null 2>&1 || true
}

# apply_pod NAME HOST_NETWORK [ANNOTATIONS_YAML] creates a pod running the test workload.
apply_pod() {
  local name="$1" host_network="$2" annotations="${3:-{\}}"
  kubectl_admin apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: ${name}
  namespace: ${NAMESPACE}
  annotations: ${annotations}
spec:
  hostNetwork: ${host_network}
  terminationGracePeriodSeconds: 1
  containers:
  - name: workload
    image: ${TEST_WORKLOAD_IMAGE}
    imagePullPolicy: Never
    command: ["/bin/sh", "-c", "trap 'exit 0' TERM; while :; do sleep 1; done"]
EOF
}

# wait_running NAME prints the seconds (0.1 s resolution) until the pod is Running.
wait_running() {
  local name="$1" start end
  start="$(date +%s%N)"
  kubectl_admin -n "${NAMESPACE}" wait "pod/${name}" --for=jsonpath='{.status.phase}'=Running --timeout=120s >/dev/null
  end="$(date +%s%N)"
  printf '%d.%d' $(((end - start) / 1000000000)) $(((end - start) / 100000000 % 10))
}

prove_pod_network() {
  local took pod_ip
  apply_pod net false
  took="$(wait_running net)"
  pod_ip="$(kubectl_admin -n "${NAMESPACE}" get pod net -o jsonpath='{.status.podIP}')"
  log "pod-network pod Running after ${took}s, IP ${pod_ip}"
  [[ "${pod_ip}" == "${POD_CIDR%.*}".* ]] || die "pod IP ${pod_ip} is not in ${POD_CIDR}"
  [[ "$(kubectl_admin -n "${NAMESPACE}" exec net -- cat /etc/hostname)" == net ]] ||
    die "kubectl exec did not reach the pod's container"
  kubectl_admin -n "${NAMESPACE}" exec net -- nc -w 3 "${SERVICE_KUBERNETES_IP}" 443 </dev/null ||
    die "the kubernetes service ${SERVICE_KUBERNETES_IP}:443 is unreachable from the pod network"
  log "kubectl exec works; the pod reaches the API server through the service VIP"
}

prove_host_network() {
  local took
  apply_pod host true
  took="$(wait_running host)"
  log "hostNetwork pod Running after ${took}s"
}

prove_required_plugin_refused() {
  local message="" deadline=$((SECONDS + 60))
  apply_pod needs-nri false \
    "{required-plugins.noderesource.dev/container.workload: '[\"${REQUIRED_PLUGIN}\"]'}"
  while (( SECONDS < deadline )); do
    message="$(kubectl_admin -n "${NAMESPACE}" get pod needs-nri \
      -o jsonpath='{.status.containerStatuses[0].state.waiting.message}' 2>/dev/null || true)"
    [[ "${message}" == *"required plugin"* ]] && break
    [[ "$(kubectl_admin -n "${NAMESPACE}" get pod needs-nri -o jsonpath='{.status.phase}')" == Running ]] &&
      die "a container requiring the absent NRI plugin ${REQUIRED_PLUGIN} was started"
    sleep 0.5
  done
  [[ "${message}" == *"required plugin"* ]] ||
    die "the container requiring NRI plugin ${REQUIRED_PLUGIN} was not refused (waiting message: ${message})"
  log "container requiring the absent NRI plugin refused: ${message}"
}

main() {
  [[ -f "${KUBECONFIG_ADMIN}" ]] || die "the cluster is not up: make cluster-up"
  trap cleanup EXIT
  kubectl_admin create namespace "${NAMESPACE}" >/dev/null 2>&1 || true
  # Pods need the namespace's default service account, created by a controller.
  until kubectl_admin -n "${NAMESPACE}" get serviceaccount default >/dev/null 2>&1; do sleep 0.2; done
  prove_pod_network
  prove_host_network
  prove_required_plugin_refused
  log "smoke test passed"
}

main "$@"

#!/usr/bin/env bash
# make demo: a local single-node cluster with simulated GPUs, the chart installed, two pods
# sharing one GPU (deployments/examples), a short summary of what each pod got, and what is left
# of each GPU (kubectl vgpu) and what each container uses (the plugin's metrics).
# MODE=device-plugin (make demo MODE=device-plugin) installs the chart in device-plugin mode
# instead: the same two pods ask for shares of the extended resource vgpu.dra.dev/vgpu
# (deployments/examples/device-plugin), and the summary also makes the GPU fail and recover.
# Leaves the cluster up; `make cluster-down` removes it.
set -euo pipefail

export LOG_NAME=demo
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

readonly NAMESPACE=vgpu-dra
readonly RELEASE=vgpu-dra
readonly PROFILE="${DEMO_PROFILE:-simulated:dgx-h200:1}"
readonly MODE="${MODE:-dra}"
readonly RESOURCE=vgpu.dra.dev/vgpu
readonly DEBUG_SOCKET=/var/lib/vgpu-dra/device-plugin-debug.sock
# The service account the demo reads /metrics as (namespace default): the chart binds it to
# <release>-metrics-reader (metrics.readers), as a user binds their Prometheus's.
readonly METRICS_SA=vgpu-metrics-scraper
export KUBECONFIG="${KUBECONFIG_ADMIN}"
# kubectl finds its plugin kubectl-vgpu (make build) on PATH.
kubectl() { PATH="${REPO_ROOT}/_output/bin:${PATH}" "${CLUSTER_BIN}/kubectl" "$@"; }
helm() { "${CLUSTER_BIN}/helm" "$@"; }

install_chart() {
  log "installing the chart (${PROFILE}, mode ${MODE})"
  helm upgrade --install "${RELEASE}" "${REPO_ROOT}/deployments/helm/vgpu-dra" \
    --namespace "${NAMESPACE}" --create-namespace --wait --timeout 3m \
    --set deviceSource="${PROFILE}" --set gpuInjection=none --set gpuCDIKind= \
    --set image.pullPolicy=Never --set logging.verbosity=4 --set mode="${MODE}" \
    --set-json "metrics.readers=[{\"kind\":\"ServiceAccount\",\"name\":\"${METRICS_SA}\",\"namespace\":\"default\"}]" >/dev/null
  if [[ "${MODE}" == device-plugin ]]; then
    kubectl -n "${NAMESPACE}" rollout status "daemonset/${RELEASE}-device-plugin" --timeout=2m >/dev/null
    wait_allocatable "$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')" '^[1-9]' "the device plugin's shares on the node"
    return
  fi
  # helm --wait does not wait for a one-node DaemonSet with maxUnavailable 1; the startup probe
  # passes once the kubelet has registered the driver.
  kubectl -n "${NAMESPACE}" rollout status "daemonset/${RELEASE}-kubelet-plugin" --timeout=2m >/dev/null
  kubectl wait --for=create resourceslice --field-selector "spec.driver=vgpu.dra.dev" --timeout=60s >/dev/null ||
    die "the plugin published no ResourceSlice within 60 s (kubectl -n ${NAMESPACE} logs ds/${RELEASE}-kubelet-plugin)"
}

# The manifests the demo is about: two pods sharing one GPU. The other examples in
# deployments/examples need more than the demo's one GPU (multi-gpu.yaml two GPUs) or would take
# cores the two shares need; the e2e suite runs each of them for real (test/e2e, TestExamples).
DRA_EXAMPLE="${REPO_ROOT}/deployments/examples/shared-gpu.yaml"
DP_EXAMPLE="${REPO_ROOT}/deployments/examples/device-plugin/shared-gpu.yaml"
DEMO_PODS=(share-a share-b)

# remove_previous_demo deletes what an earlier demo (of either mode) left on a cluster that
# stayed up, before the chart changes: a DRA pod's claims must be unprepared by the plugin that
# prepared them, so its pods go while that plugin still runs.
remove_previous_demo() {
  kubectl get namespace default >/dev/null 2>&1 || return 0
  kubectl delete pod "${DEMO_PODS[@]}" --ignore-not-found --wait --timeout=2m >/dev/null
  kubectl delete -f "${DRA_EXAMPLE}" -f "${DP_EXAMPLE}" --ignore-not-found --wait --timeout=2m >/dev/null
}

run_examples() {
  local example="${DRA_EXAMPLE}"
  [[ "${MODE}" == device-plugin ]] && example="${DP_EXAMPLE}"
  log "starting ${example#"${REPO_ROOT}/"} (two pods, one GPU)"
  kubectl apply -f "${example}" >/dev/null
  if ! kubectl wait --for=condition=Ready "${DEMO_PODS[@]/#/pod/}" --timeout=120s >/dev/null 2>&1; then
    explain_not_ready "${DEMO_PODS[@]}"
    die "the demo's pods did not start within 120 s (above: why, for each pod that is not Ready)"
  fi
}

# explain_not_ready POD... prints one line per pod that is not Ready, with the reason a person
# can act on: the scheduler's (Pending: why no node fits), the kubelet's for a container that
# waits (its reason and message), or else the pod's last Warning event.
explain_not_ready() {
  local pod line
  for pod in "$@"; do
    line="$(kubectl get pod "${pod}" -o go-template='{{.status.phase}}{{range .status.conditions}}{{if and (eq .type "PodScheduled") (ne .status "True")}}: not scheduled: {{.message}}{{end}}{{end}}{{range .status.containerStatuses}}{{if .state.waiting}}: container {{.name}} waiting: {{.state.waiting.reason}} {{.state.waiting.message}}{{end}}{{end}}{{range .status.conditions}}{{if and (eq .type "Ready") (eq .status "True")}} READY{{end}}{{end}}' 2>&1)" ||
      line="not found: ${line}"
    [[ "${line}" == *" READY" ]] && continue
    if [[ "${line}" != *:* ]]; then
      line+=": $(kubectl get events --field-selector "involvedObject.name=${pod},type=Warning" \
        --sort-by=.lastTimestamp -o jsonpath='{range .items[-1:]}{.reason} {.message}{end}' 2>/dev/null)"
    fi
    log "pod ${pod} is ${line}"
  done
}

# expect WHAT TEXT PATTERN: the demo shows what it promises, or says what it did not show and
# fails (CI runs the demo: a broken main job fails it).
expect() {
  grep -Eq -- "$3" <<<"$2" && return 0
  printf '%s\n' "$2" | sed 's/^/  /' >&2
  die "the demo did not show $1 (wanted a match of: $3)"
}

# summary prints, for a person: the devices with what is left of them, then each pod's GPU,
# limits and identity as its container sees them.
summary() {
  local pod claim out
  echo
  echo "== kubectl vgpu nodes: every GPU vgpu-dra publishes, what the claims took of it and what is left"
  kubectl vgpu nodes -o wide
  echo
  echo "== kubectl vgpu pods: the share each pod holds"
  kubectl vgpu pods -o wide
  for pod in share-a share-b; do
    claim=$(kubectl get pod "${pod}" -o jsonpath='{.status.resourceClaimStatuses[0].resourceClaimName}')
    echo
    echo "== pod ${pod} (claim ${claim}, $(kubectl get resourceclaim "${claim}" -o jsonpath='{.status.allocation.devices.results[0].device}'))"
    kubectl exec "${pod}" -- sh -c 'env | grep -E "^(MANAGER_VISIBLE_DEVICE_|CUDA_MEM_LIMIT_|CUDA_CORE_LIMIT_|MANAGER_VGPU_CLAIM_UID|VGPU_)" | grep -v "=$" | sort; echo "registration:"; vgpu-registry-client 2>&1 | sed "s/^/  /"; echo "mounts:"; grep -E " (/etc/vgpu-dra|/etc/ld.so.preload|/tmp/.vgpu_lock|/tmp/.vmem_node)" /proc/self/mounts | cut -d" " -f2,4 | cut -d, -f1 | sed "s/^/  /"'
  done
  # libvgpu.so at work: a CUDA-like program (the library suite's probe over its fake driver,
  # whose one GPU is the claim's) allocates 8 GiB, then 4 GiB more than the 10Gi claim allows.
  echo
  echo "== libvgpu.so in share-a: allocate 8192 MiB, then 4096 MiB (result 2 = CUDA_ERROR_OUT_OF_MEMORY), then 1024 MiB"
  out="$(kubectl exec share-a -- sh -c 'FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe alloc 8192 4096 1024')"
  sed "s/^/  /" <<<"${out}"
  expect "libvgpu.so holding share-a to its 10Gi" "${out}" $'alloc 8192 MiB = 0\nalloc 4096 MiB = 2\nalloc 1024 MiB = 0'
  usage
  echo
  echo "The cluster stays up: export KUBECONFIG=${KUBECONFIG_ADMIN}; remove it with: make cluster-down"
}

# summary_device_plugin is summary for device-plugin mode: the node's shares, each pod's share as
# its container sees it, the library at work, and the GPU failing and recovering.
summary_device_plugin() {
  local pod node gpu out
  node="$(kubectl get nodes -o jsonpath='{.items[0].metadata.name}')"
  echo
  echo "== node ${node}: shares of ${RESOURCE} (capacity/allocatable) and their size (labels)"
  kubectl get node "${node}" -o jsonpath="{.status.capacity.${RESOURCE//./\\.}}{\"/\"}{.status.allocatable.${RESOURCE//./\\.}}{\"\\n\"}"
  kubectl get node "${node}" --show-labels=false -L "${RESOURCE}.shares-per-gpu,${RESOURCE}.memory-mib,${RESOURCE}.cores" | sed "s/^/  /"
  for pod in share-a share-b; do
    echo
    echo "== pod ${pod} (${RESOURCE}: 1)"
    kubectl exec "${pod}" -- sh -c 'env | grep -E "^(MANAGER_VISIBLE_DEVICE_|CUDA_MEM_LIMIT_|CUDA_CORE_LIMIT_|MANAGER_CLIENT_REGISTER_UUID)" | grep -v "=$" | sort; echo "vgpu.config:"; grep -v "^#" /etc/vgpu-dra/config/vgpu.config | sed "s/^/  /"; echo "registration:"; vgpu-registry-client 2>&1 | sed "s/^/  /"'
  done
  local mib
  mib="$(kubectl get node "${node}" -o jsonpath="{.metadata.labels.${RESOURCE//./\\.}\.memory-mib}")"
  echo
  echo "== libvgpu.so in share-a: allocate $((mib - 1024)) MiB, then 2048 MiB (result 2 = CUDA_ERROR_OUT_OF_MEMORY), then 1024 MiB"
  out="$(kubectl exec share-a -- sh -c "FAKE_GPU_DEVICES=\"\$MANAGER_VISIBLE_DEVICE_0:144384\" vgpu_probe alloc $((mib - 1024)) 2048 1024")"
  sed "s/^/  /" <<<"${out}"
  expect "libvgpu.so holding share-a to its ${mib} MiB share" "${out}" "alloc $((mib - 1024)) MiB = 0"$'\n'"alloc 2048 MiB = 2"$'\n'"alloc 1024 MiB = 0"
  gpu="$(kubectl exec share-a -- sh -c 'echo $MANAGER_VISIBLE_DEVICE_0')"
  echo
  echo "== the GPU fails (simulated XID 79 through the plugin's debug socket), then recovers"
  curl -fsS --unix-socket "${DEBUG_SOCKET}" -X POST "http://localhost/health?gpu=${gpu}&healthy=false&xid=79"
  wait_allocatable "${node}" '^0$' "no allocatable ${RESOURCE} after the fault"
  echo "  allocatable ${RESOURCE} after the fault: 0"
  curl -fsS --unix-socket "${DEBUG_SOCKET}" -X POST "http://localhost/health?gpu=${gpu}&healthy=true"
  wait_allocatable "${node}" '^[1-9]' "allocatable ${RESOURCE} back after the recovery"
  echo "  allocatable ${RESOURCE} after the recovery: $(allocatable "${node}")"
  echo
  echo "The cluster stays up: export KUBECONFIG=${KUBECONFIG_ADMIN}; remove it with: make cluster-down"
}

allocatable() { kubectl get node "$1" -o jsonpath="{.status.allocatable.${RESOURCE//./\\.}}"; }

# wait_allocatable NODE PATTERN WHAT waits up to 60 s for the node's allocatable shares to match.
wait_allocatable() {
  local deadline=$((SECONDS + 60))
  until [[ "$(allocatable "$1")" =~ $2 ]]; do
    (( SECONDS < deadline )) || die "the demo did not show $3 within 60 s (allocatable: $(allocatable "$1"))"
    sleep 0.5
  done
}

# usage shows the plugin's per-container metrics: a process in share-a holds 9 GiB of its 10Gi
# (the fake driver's memory, counted by libvgpu.so's ledger), and /metrics has it within one
# sample (5 s). /metrics is read as Prometheus would (metrics.auth delegated, the chart's
# default): HTTPS with the plugin's self-signed certificate, and a token of a service account
# allowed to get /metrics.
usage() {
  local ip metrics token
  kubectl exec share-a -- sh -c 'FAKE_GPU_DEVICES="$MANAGER_VISIBLE_DEVICE_0:144384" vgpu_probe hold 9216 >/tmp/hold.out 2>&1 &'
  ip=$(kubectl -n "${NAMESPACE}" get pods -l app.kubernetes.io/component=kubelet-plugin -o jsonpath='{.items[0].status.podIP}')
  kubectl -n default get serviceaccount "${METRICS_SA}" >/dev/null 2>&1 || kubectl -n default create serviceaccount "${METRICS_SA}" >/dev/null
  token=$(kubectl -n default create token "${METRICS_SA}" --duration=10m)
  for _ in $(seq 1 60); do
    metrics=$(curl -fsSk --max-time 3 -H "Authorization: Bearer ${token}" "https://${ip}:8080/metrics" | grep -E '^vgpu_dra_(container_(memory|cores)_|gpu_(memory|cores|shares|containers))' || true)
    grep -q 'container_memory_used_bytes{.*pod="share-a".* 9.663676416e+09' <<<"${metrics}" && break
    sleep 0.5
  done
  echo
  echo "== the plugin's /metrics (${ip}:8080): share-a holds 9 GiB of its 10Gi, share-b nothing"
  sed 's/^/  /' <<<"${metrics}"
  expect "share-a's 9 GiB in the plugin's /metrics within 30 s" "${metrics}" 'container_memory_used_bytes\{.*pod="share-a".* 9.663676416e\+09'
}

main() {
  case "${MODE}" in
    dra | device-plugin) ;;
    *) die "MODE=${MODE}: want dra or device-plugin" ;;
  esac
  require_root
  take_suite_lock
  # The cluster's binaries are built (or found in the machine's cache) once, here: make demo
  # no longer depends on cluster-bins, and cluster-up.sh is run directly rather than through
  # make cluster-up, whose own cluster-bins prerequisite waited on the build lock a second time.
  "${HACK_DIR}/build-cluster-bins.sh"
  "${HACK_DIR}/build-artifacts.sh"
  "${HACK_DIR}/cluster-up.sh"
  "${HACK_DIR}/images.sh" plugin test-workload
  remove_previous_demo
  install_chart
  run_examples
  if [[ "${MODE}" == device-plugin ]]; then
    summary_device_plugin
  else
    summary
  fi
}

main "$@"

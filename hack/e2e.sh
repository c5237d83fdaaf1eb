#!/usr/bin/env bash
# make e2e: brings the local cluster up (hack/cluster-up.sh), builds and imports the plugin and
# workload images, runs the Go e2e suite (test/e2e, build tag e2e) against it, and always takes
# the cluster down again, also when the suite fails. E2E_GO_TEST_ARGS replaces the selection of
# what runs (make bench-webhook runs the webhook's admission benchmark instead of the tests).
set -euo pipefail

export LOG_NAME=e2e
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

teardown() {
  local rc=$?
  log "taking the cluster down"
  make -C "${REPO_ROOT}" --no-print-directory cluster-down || rc=1
  exit "${rc}"
}

main() {
  require_root
  take_suite_lock
  # Once, here (see hack/demo.sh): make e2e does not depend on cluster-bins, and cluster-up.sh
  # runs directly, so the build lock is not waited on twice.
  "${HACK_DIR}/build-cluster-bins.sh"
  "${HACK_DIR}/install-test-deps.sh" # prometheus, which the suite runs
  "${HACK_DIR}/build-artifacts.sh"
  log "helm lint"
  "${CLUSTER_BIN}/helm" lint --strict "${REPO_ROOT}/deployments/helm/vgpu-dra"
  # values.schema.json is in force: helm itself refuses a value the binaries would refuse.
  local refused
  refused="$("${CLUSTER_BIN}/helm" template "${REPO_ROOT}/deployments/helm/vgpu-dra" --kube-version 1.37.2 \
    --set deviceSource=bogus 2>&1 >/dev/null)" && die "helm template took --set deviceSource=bogus: values.schema.json is not in force"
  [[ "${refused}" == *"'/deviceSource'"* ]] || die "helm template refused --set deviceSource=bogus, but not by the schema: ${refused}"
  trap teardown EXIT
  # A cluster left up (make demo) has the demo's release and pods: cluster-up would keep it.
  take_down_cluster_left_up "the e2e suite"
  "${HACK_DIR}/cluster-up.sh"
  "${HACK_DIR}/images.sh" plugin plugin-next test-workload
  log "running test/e2e"
  local args=(-v)
  [[ -n "${E2E_GO_TEST_ARGS:-}" ]] && read -r -a args <<<"${E2E_GO_TEST_ARGS}"
  (cd "${REPO_ROOT}" && KUBECONFIG="${KUBECONFIG_ADMIN}" go test -tags e2e -count=1 -timeout 25m "${args[@]}" ./test/e2e/)
}

main "$@"

#!/usr/bin/env bash
# Builds the binaries of the local test cluster from their Go modules (there is no Docker engine
# and no download but the Go module proxy here) and links them into _output/cluster/bin.
#
# Each component is built once per version (and build recipe) into a machine-level cache,
# ${VGPU_DRA_CACHE:-/var/cache/vgpu-dra}/bin/<component>-<version>-<recipe hash>/, so that a fresh clone of the
# repository on the same machine (CI) reuses it: a cold build takes 30-45 minutes on two cores, a
# cached run a second. The Go build cache ($(go env GOCACHE)) is machine-level too, so a version
# bump relinks instead of recompiling everything unchanged.
#
# Missing Debian packages the cluster needs (runc, CNI plugins ...) are installed first
# (hack/install-cluster-deps.sh).
#
# Usage: hack/build-cluster-bins.sh [component...]   (default: all; see COMPONENTS below)
set -euo pipefail

readonly KUBE_VERSION=v1.37.2
readonly ETCD_VERSION=v3.7.0
readonly CONTAINERD_VERSION=v2.4.2
readonly HELM_VERSION=v3.22.0

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REPO_ROOT
readonly CACHE_DIR="${VGPU_DRA_CACHE:-/var/cache/vgpu-dra}/bin"
readonly OUT_BIN="${REPO_ROOT}/_output/cluster/bin"
readonly KUBE_MODULE_DIR="${REPO_ROOT}/hack/tools/kube"
# How often a long build reports that it is still running.
readonly PROGRESS_INTERVAL_S="${PROGRESS_INTERVAL_S:-30}"

readonly COMPONENTS=(etcd kube containerd helm)
readonly KUBE_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kubectl kube-proxy)
readonly CONTAINERD_COMMANDS=(containerd ctr containerd-shim-runc-v2)

log() { printf '[build-cluster-bins %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

# format_duration 125 -> "2m05s"
format_duration() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# run_with_progress LABEL LOGFILE CMD... runs CMD with its output in LOGFILE and prints the
# elapsed time every PROGRESS_INTERVAL_S seconds, because a cold Kubernetes build is silent for
# up to half an hour. On failure the log's tail is shown.
run_with_progress() {
  local label="$1" logfile="$2"
  shift 2
  local start=${SECONDS} pid rc=0 next_report
  next_report=$((SECONDS + PROGRESS_INTERVAL_S))
  log "building ${label} (log: ${logfile})"
  "$@" >"${logfile}" 2>&1 &
  pid=$!
  while kill -0 "${pid}" 2>/dev/null; do
    sleep 1
    if (( SECONDS >= next_report )) && kill -0 "${pid}" 2>/dev/null; then
      log "  ${label}: still building, $(format_duration $((SECONDS - start))) elapsed"
      next_report=$((SECONDS + PROGRESS_INTERVAL_S))
    fi
  done
  wait "${pid}" || rc=$?
  if (( rc != 0 )); then
    tail -n 40 "${logfile}" >&2
    die "${label} failed after $(format_duration $((SECONDS - start))) (exit ${rc}); full log: ${logfile}"
  fi
  log "built ${label} in $(format_duration $((SECONDS - start)))"
}

# recipe_hash NAME hashes how NAME is built (its build function, the command lists and, for the
# wrapper module's components, its go.mod/go.sum), so that changing the recipe without changing
# the version does not reuse a stale cache entry.
recipe_hash() {
  local name="$1"
  {
    declare -f "build_${name}"
    declare -p KUBE_COMMANDS CONTAINERD_COMMANDS
    if [[ "${name}" == kube || "${name}" == etcd ]]; then
      cat "${KUBE_MODULE_DIR}/go.mod" "${KUBE_MODULE_DIR}/go.sum"
    fi
  } | sha256sum | cut -c1-12
}

# The cache directory of one component version. It exists only once the build succeeded: builds go
# to a staging directory that is renamed into place, so an interrupted build is never mistaken for
# a cached one.
cache_dir_of() { echo "${CACHE_DIR}/$1-$2-$(recipe_hash "$1")"; }

# build_into_cache NAME VERSION BUILD_FUNCTION: calls BUILD_FUNCTION STAGING_DIR LOGFILE unless
# NAME-VERSION is already cached.
build_into_cache() {
  local name="$1" version="$2" build_fn="$3"
  local final staging
  final="$(cache_dir_of "${name}" "${version}")"
  if [[ -d "${final}" ]]; then
    log "${name} ${version}: cached in ${final}"
    return
  fi
  staging="${final}.partial.$$"
  rm -rf "${staging}"
  mkdir -p "${staging}"
  # shellcheck disable=SC2064 # expand now: the trap must remove this very directory.
  trap "rm -rf '${staging}'" EXIT
  "${build_fn}" "${staging}" "${final}.log"
  mv -T "${staging}" "${final}"
  trap - EXIT
}

# Kubernetes and etcd come from the wrapper module hack/tools/kube (see its go.mod for why).
# CGO_ENABLED=0 gives static binaries that do not depend on this machine's libc.
build_kube() {
  local staging="$1" logfile="$2" pkgs=() cmd
  for cmd in "${KUBE_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/${cmd}"); done
  local version_ldflags="" pkg
  # The binaries report (and the kubelet registers the node with) this version; without it they
  # say v0.0.0-master, which breaks version skew checks.
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    version_ldflags+=" -X ${pkg}.gitVersion=${KUBE_VERSION} -X ${pkg}.gitMajor=1"
    version_ldflags+=" -X ${pkg}.gitMinor=37 -X ${pkg}.gitTreeState=clean"
  done
  log "kubernetes commands: ${KUBE_COMMANDS[*]}"
  run_with_progress "kubernetes ${KUBE_VERSION}" "${logfile}" \
    env -C "${KUBE_MODULE_DIR}" CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    nice -n 19 go build -trimpath -ldflags "-s -w${version_ldflags}" -o "${staging}/" "${pkgs[@]}"
}

build_etcd() {
  local staging="$1" logfile="$2"
  run_with_progress "etcd ${ETCD_VERSION}" "${logfile}" \
    env -C "${KUBE_MODULE_DIR}" CGO_ENABLED=0 GOFLAGS=-mod=readonly \
    nice -n 19 go build -trimpath -ldflags "-s -w" -o "${staging}/etcd" ./cmd/etcd
}

# containerd needs cgo (btrfs snapshotter headers are in linux-libc-dev). `go install pkg@version`
# refuses GOFLAGS=-mod=..., so GOFLAGS is cleared for it.
build_containerd() {
  local staging="$1" logfile="$2" pkgs=() cmd
  for cmd in "${CONTAINERD_COMMANDS[@]}"; do
    pkgs+=("github.com/containerd/containerd/v2/cmd/${cmd}@${CONTAINERD_VERSION}")
  done
  log "containerd commands: ${CONTAINERD_COMMANDS[*]}"
  run_with_progress "containerd ${CONTAINERD_VERSION}" "${logfile}" \
    env GOBIN="${staging}" CGO_ENABLED=1 GOFLAGS= nice -n 19 go install -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=${CONTAINERD_VERSION}" \
    "${pkgs[@]}"
}

build_helm() {
  local staging="$1" logfile="$2"
  run_with_progress "helm ${HELM_VERSION}" "${logfile}" \
    env GOBIN="${staging}" CGO_ENABLED=0 GOFLAGS= nice -n 19 go install -trimpath \
    -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=${HELM_VERSION}" \
    "helm.sh/helm/v3/cmd/helm@${HELM_VERSION}"
}

version_of() {
  case "$1" in
    kube) echo "${KUBE_VERSION}" ;;
    etcd) echo "${ETCD_VERSION}" ;;
    containerd) echo "${CONTAINERD_VERSION}" ;;
    helm) echo "${HELM_VERSION}" ;;
    *) die "unknown component $1 (known: ${COMPONENTS[*]})" ;;
  esac
}

# Symlinks, not copies: _output/cluster/bin is per clone, the cache is per machine.
link_into_output() {
  local dir="$1" bin
  mkdir -p "${OUT_BIN}"
  for bin in "${dir}"/*; do
    ln -sfn "${bin}" "${OUT_BIN}/$(basename "${bin}")"
  done
}

main() {
  local components=("$@") name version start=${SECONDS}
  (( ${#components[@]} > 0 )) || components=("${COMPONENTS[@]}")
  command -v go >/dev/null || die "go is not in PATH"
  "${REPO_ROOT}/hack/install-cluster-deps.sh"
  mkdir -p "${CACHE_DIR}"
  # Two clones building at once would build twice and the second rename would fail: the second
  # waits here and then finds the first one's result in the cache.
  exec 8>"${CACHE_DIR}/.build.lock"
  flock 8
  for name in "${components[@]}"; do
    version="$(version_of "${name}")"
    build_into_cache "${name}" "${version}" "build_${name}"
    link_into_output "$(cache_dir_of "${name}" "${version}")"
  done
  log "done in $(format_duration $((SECONDS - start))): binaries in ${OUT_BIN}"
}

main "$@"

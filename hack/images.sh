#!/usr/bin/env bash
# Assembles the local cluster's container images from host files (there is no container engine
# and no registry here) and imports them into the cluster's containerd.
#
# Usage: hack/images.sh [--no-import] IMAGE...
#   pause          docker.io/vgpu-dra/pause:dev, the pod sandbox (hack/images/pause.c, gcc -static)
#   test-workload  docker.io/vgpu-dra/test-workload:dev, Debian's static busybox (sh, cat, mount ...),
#                  the static programs in _output/workload and, once built, the CUDA test doubles
#                  in _output/workload-cuda (vgpu_probe, fake libcuda/libnvidia-ml) with their glibc
#   plugin         docker.io/vgpu-dra/vgpu-dra:dev, every binary in _output/bin (make build) with the
#                  shared libraries it links, plus libvgpu.so once it is built (PLUGIN_LIBVGPU)
#   plugin-next    the plugin image built again as docker.io/vgpu-dra/vgpu-dra:next, with a build
#                  marker (/etc/vgpu-dra-build) that makes it another image: what the e2e suite's
#                  helm upgrade rolls to
#   base           pause and test-workload (what cluster-up imports)
# Archives are written to _output/cluster/images/<image>.tar (OCI image layout, see
# hack/tools/cmd/imagetool). `ctr images import` of an unchanged archive is a no-op.
set -euo pipefail

export LOG_NAME="${LOG_NAME:-images}"
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

readonly IMAGE_DIR="${REPO_ROOT}/_output/cluster/images"
readonly IMAGETOOL="${REPO_ROOT}/_output/cluster/bin/imagetool"
# Where the plugin image takes its files from; see build_plugin_image.
readonly PLUGIN_BIN_DIR="${PLUGIN_BIN_DIR:-${REPO_ROOT}/_output/bin}"
readonly WORKLOAD_BIN_DIR="${WORKLOAD_BIN_DIR:-${REPO_ROOT}/_output/workload}"
readonly WORKLOAD_CUDA_DIR="${WORKLOAD_CUDA_DIR:-${REPO_ROOT}/_output/workload-cuda}"
# Where the workload image keeps the fake driver (on its LD_LIBRARY_PATH): not the standard lib
# dirs, so that nothing mistakes it for a real driver injected by the GPU's own CDI spec.
readonly WORKLOAD_FAKE_LIB_DIR="/usr/local/lib/fake-nvidia"
readonly PLUGIN_LIBVGPU="${PLUGIN_LIBVGPU:-${REPO_ROOT}/_output/lib/libvgpu.so}"
# Path of libvgpu.so in the plugin image, from which the plugin installs it into the state dir.
readonly PLUGIN_IMAGE_LIBVGPU="/usr/local/lib/vgpu-dra/libvgpu.so"

# build_imagetool compiles the image tool from its own module (Go's build cache makes a repeat a
# matter of a second).
build_imagetool() {
  mkdir -p "$(dirname "${IMAGETOOL}")"
  (cd "${HACK_DIR}/tools" && GOFLAGS=-mod=readonly CGO_ENABLED=0 go build -trimpath -o "${IMAGETOOL}" ./cmd/imagetool)
}

build_pause_image() {
  local work="$1"
  gcc -std=c11 -Wall -Wextra -Werror -O2 -static -s -o "${work}/pause" "${HACK_DIR}/images/pause.c"
  "${IMAGETOOL}" -o "${IMAGE_DIR}/pause.tar" -name "${PAUSE_IMAGE}" \
    -add "${work}/pause:/pause:755" -entrypoint '["/pause"]'
}

# build_test_workload_image: busybox from Debian's busybox-static with one symlink per applet,
# plus the few files that tools inside expect (/tmp, /etc/passwd).
build_test_workload_image() {
  local work="$1" busybox applet args=()
  busybox="$(command -v busybox)" || die "busybox not found: apt-get install busybox-static"
  file -L "${busybox}" 2>/dev/null | grep -q 'statically linked' ||
    die "${busybox} is not static: apt-get install busybox-static"
  printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n' >"${work}/passwd"
  printf 'root:x:0:\nnogroup:x:65534:\n' >"${work}/group"
  args+=(-add "${busybox}:/bin/busybox:755" -add "${work}/passwd:/etc/passwd:644"
    -add "${work}/group:/etc/group:644" -dir /tmp:1777 -dir /root:700 -dir /proc -dir /sys -dir /dev)
  for applet in $("${busybox}" --list); do
    [[ "${applet}" == busybox ]] || args+=(-symlink "/bin/${applet}:busybox")
  done
  # Static test programs of the project (hack/build-workload.sh): the registry client that
  # registers the way libvgpu.so does and prints what it got.
  local prog
  for prog in "${WORKLOAD_BIN_DIR}"/*; do
    [[ -f "${prog}" && -x "${prog}" ]] && args+=(-add "${prog}:/usr/local/bin/$(basename "${prog}"):755")
  done
  # The library suite's CUDA test doubles (hack/build-artifacts.sh): vgpu_probe, a CUDA-like
  # program, at /usr/local/bin; the fake libcuda.so.1 and libnvidia-ml.so.1 it links in
  # WORKLOAD_FAKE_LIB_DIR; and the glibc libraries (and loader) that they and the preloaded
  # libvgpu.so load, at their host paths (busybox is static and needs none). ldd resolves the
  # fakes to the build tree through the probe's RUNPATH: those paths are left out. The fake keeps
  # its GPU's state in FAKE_GPU_STATE (shared by the container's processes) and reports the PIDs
  # it sees (FAKE_PID_OFFSET=0); FAKE_GPU_DEVICES (UUID:MiB) is the caller's to set.
  local env=(-env PATH=/usr/local/bin:/bin) lib
  if [[ -x "${WORKLOAD_CUDA_DIR}/bin/vgpu_probe" ]]; then
    args+=(-add "${WORKLOAD_CUDA_DIR}/bin/vgpu_probe:/usr/local/bin/vgpu_probe:755")
    for lib in libcuda.so.1 libnvidia-ml.so.1; do
      args+=(-add "${WORKLOAD_CUDA_DIR}/lib/${lib}:${WORKLOAD_FAKE_LIB_DIR}/${lib}:755")
    done
    for lib in $(shared_libraries "${WORKLOAD_CUDA_DIR}/bin/vgpu_probe" "${WORKLOAD_CUDA_DIR}"/lib/*.so.1 "${PLUGIN_LIBVGPU}"); do
      [[ "${lib}" == "${REPO_ROOT}/"* ]] || args+=(-add "${lib}:${lib}")
    done
    env+=(-env "LD_LIBRARY_PATH=${WORKLOAD_FAKE_LIB_DIR}" -env FAKE_GPU_STATE=/tmp/fake-gpu.state -env FAKE_PID_OFFSET=0)
  else
    log "no ${WORKLOAD_CUDA_DIR}/bin/vgpu_probe: test-workload image without the CUDA test doubles"
  fi
  "${IMAGETOOL}" -o "${IMAGE_DIR}/test-workload.tar" -name "${TEST_WORKLOAD_IMAGE}" \
    -cmd '["/bin/sh"]' "${env[@]}" "${args[@]}"
}

# shared_libraries BINARY... prints every shared library (and the dynamic loader) the binaries
# load, by host path. Static binaries (CGO_ENABLED=0) print nothing.
shared_libraries() {
  local bin
  for bin in "$@"; do
    ldd "${bin}" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\// { print $1 }'
  done | sort -u
}

# build_plugin_image: the DaemonSet's image. Binaries go to /usr/local/bin (on PATH), their shared
# libraries to the same paths as on this host, libvgpu.so (when built) to PLUGIN_IMAGE_LIBVGPU.
# To add files, extend the args here; keep the layout in step with the top-level Dockerfile.
build_plugin_image() {
  local name="${2:-${PLUGIN_IMAGE}}" archive="${3:-plugin.tar}" bin lib bins=() args=("${@:4}")
  for bin in "${PLUGIN_BIN_DIR}"/*; do
    [[ -f "${bin}" && -x "${bin}" ]] && bins+=("${bin}")
  done
  (( ${#bins[@]} > 0 )) || die "no binaries in ${PLUGIN_BIN_DIR}: run 'make build' first"
  for bin in "${bins[@]}"; do
    args+=(-add "${bin}:/usr/local/bin/$(basename "${bin}"):755")
  done
  for lib in $(shared_libraries "${bins[@]}"); do
    args+=(-add "${lib}:${lib}")
  done
  if [[ -f "${PLUGIN_LIBVGPU}" ]]; then
    args+=(-add "${PLUGIN_LIBVGPU}:${PLUGIN_IMAGE_LIBVGPU}:644")
  else
    log "no ${PLUGIN_LIBVGPU}: plugin image without libvgpu.so"
  fi
  "${IMAGETOOL}" -o "${IMAGE_DIR}/${archive}" -name "${name}" -dir /tmp:1777 "${args[@]}"
}

# build_plugin_next_image: the plugin image again under the tag "next", with a file that says so.
build_plugin_next_image() {
  local work="$1"
  echo "next" >"${work}/build"
  build_plugin_image "${work}" "${PLUGIN_IMAGE%:*}:next" plugin-next.tar -add "${work}/build:/etc/vgpu-dra-build:644"
}

# import_image ARCHIVE loads an archive into the CRI namespace (k8s.io) of the cluster's
# containerd. ctr needs the socket's absolute path (-a).
import_image() {
  [[ -S "${CONTAINERD_SOCKET}" ]] || die "containerd is not running (${CONTAINERD_SOCKET}): make cluster-up"
  # ctr warns on every call that cgroup v1 is deprecated: this VM has no choice; drop that line.
  "${CLUSTER_BIN}/ctr" -a "${CONTAINERD_SOCKET}" -n k8s.io images import "$1" 2>&1 >/dev/null |
    { grep -v 'support for cgroup v1 is deprecated' || true; } >&2
}

main() {
  local import=1 images=() image work start=${SECONDS}
  while (( $# > 0 )); do
    case "$1" in
      --no-import) import=0 ;;
      base) images+=(pause test-workload) ;;
      pause | test-workload | plugin | plugin-next) images+=("$1") ;;
      *) die "unknown image $1 (pause, test-workload, plugin, plugin-next, base)" ;;
    esac
    shift
  done
  (( ${#images[@]} > 0 )) || images=(pause test-workload)
  mkdir -p "${IMAGE_DIR}"
  build_imagetool
  work="$(mktemp -d)"
  # shellcheck disable=SC2064 # expand now: remove this very directory.
  trap "rm -rf '${work}'" EXIT
  for image in "${images[@]}"; do
    "build_${image//-/_}_image" "${work}"
    if (( import )); then
      import_image "${IMAGE_DIR}/${image}.tar"
      log "imported ${image} ($(du -h "${IMAGE_DIR}/${image}.tar" | cut -f1))"
    else
      log "wrote ${IMAGE_DIR}/${image}.tar"
    fi
  done
  log "images done in $((SECONDS - start))s"
}

main "$@"

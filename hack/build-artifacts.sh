#!/usr/bin/env bash
# Builds what the plugin and test-workload images carry: the Go binaries (_output/bin),
# libvgpu.so (_output/lib), the static registry client of the workload image
# (_output/workload) and the library suite's CUDA test doubles for the workload image
# (_output/workload-cuda: vgpu_probe, the fake libcuda.so.1 and libnvidia-ml.so.1).
# Used by make demo and make e2e before hack/images.sh.
set -euo pipefail

export LOG_NAME=artifacts
HACK_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${HACK_DIR}/lib/cluster.sh"

log "building the plugin binaries, libvgpu.so and the workload's registry client"
make -C "${REPO_ROOT}" --no-print-directory build
cmake -S "${REPO_ROOT}/library" -B "${REPO_ROOT}/_output/library" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "${REPO_ROOT}/_output/library" --target vgpu vgpu_probe fakecuda fakenvml -j2 >/dev/null
install -D -m 0644 "${REPO_ROOT}/_output/library/libvgpu.so" "${REPO_ROOT}/_output/lib/libvgpu.so"
# A CUDA-like program and the fake driver it links (library/test), run in vGPU pods through the
# preloaded libvgpu.so (e2e scenario 9). Dynamic: hack/images.sh adds the glibc they load.
install -D -m 0755 "${REPO_ROOT}/_output/library/test/vgpu_probe" "${REPO_ROOT}/_output/workload-cuda/bin/vgpu_probe"
for lib in libcuda.so.1 libnvidia-ml.so.1; do
  install -D -m 0755 "${REPO_ROOT}/_output/library/test/fake/${lib}" "${REPO_ROOT}/_output/workload-cuda/lib/${lib}"
done
# Static, so that it runs in the busybox-based workload image.
(cd "${REPO_ROOT}" && CGO_ENABLED=0 go build -trimpath -o _output/workload/ ./cmd/vgpu-registry-client)

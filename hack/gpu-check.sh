#!/usr/bin/env bash
# libvgpu on a real NVIDIA GPU: the checks and figures of the library's test suite against
# the real driver instead of the fake one. By hand on a machine with a GPU, driver and
# nvidia-smi; no nvcc (kernels are PTX, JIT-compiled by the driver). Not part of CI.
#
#   hack/gpu-check.sh [build dir]     (default _output/library; built with cmake if missing)
#
# Uses libvgpu-test.so (the shipped library plus VGPU_TEST_ROOT) with a temporary container
# root and the suite's scripted registry, so it needs neither the kubelet plugin nor, but for the
# enforcer's check (a cgroup of its own), root. Where python3 has torch with CUDA, it then runs
# issue 26's compute measures with PyTorch (hack/gpu-check/torch-measures.sh); else it says SKIP.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-_output/library}
if [ ! -x "$build/test/gpu_check" ]; then
	cmake -S library -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build "$build" -j2 --target vgpu vgpu-test gpu_check scripted_registry_main >/dev/null
fi
build=$(cd "$build" && pwd)
lib=$build/libvgpu-test.so
check=$build/test/gpu_check

sh library/test/check_glibc_versions.sh "$build/libvgpu.so"

uuid=$(nvidia-smi --query-gpu=uuid --format=csv,noheader -i 0)
limit_mib=1024
root=$(mktemp -d /tmp/vgc.XXXXXX)
mkdir -p "$root/etc/vgpu-dra/registry" "$root/etc/vgpu-dra/config" "$root/tmp/.vgpu_lock" "$root/tmp/.vmem_node"
"$build/test/scripted_registry_main" "$root/etc/vgpu-dra/registry/registry.sock" OK \
	"$root/etc/vgpu-dra/config/pids.config" 0 &
registry=$!
cleanup() {
	# scripted_registry_main serves from a child of its own, which outlives it: stop both.
	local kids=()
	{ read -ra kids <"/proc/$registry/task/$registry/children"; } 2>/dev/null || true
	kill "${kids[@]}" "$registry" 2>/dev/null || true
	wait "$registry" 2>/dev/null || true
	rm -rf "$root"
}
trap cleanup EXIT

# One visible GPU (index 0); NVML PIDs are host PIDs here (offset 0). Its limits come from
# vgpu.config, as the plugin writes it (contract §4): config <memory bytes> <core percent>.
vgpu_env=(LD_PRELOAD="$lib" VGPU_TEST_ROOT="$root" CUDA_VISIBLE_DEVICES=0)
config() {
	printf 'version 1\npod 0b7a2c6e-1f7e-4c9e-9d2a-3f1e5b6c7d8e\ncontainer gpu-check\ngpu 0 %s %s %s\n' \
		"$uuid" "$1" "$2" >"$root/etc/vgpu-dra/config/vgpu.config"
}
fail=0
expect() { # expect <what> <output> <text>
	if grep -qF -- "$3" <<<"$2"; then echo "ok   $1"; else echo "FAIL $1: wanted '$3' in:"; echo "$2"; fail=1; fi
}

echo "== memory limit ${limit_mib} MiB on $uuid"
config $((limit_mib << 20)) 0
out=$(env "${vgpu_env[@]}" "$check" info $limit_mib)
echo "$out"
expect "cuMemGetInfo reports the limit" "$out" "total ${limit_mib} MiB"
expect "allocation over the limit refused" "$out" "alloc limit+1MiB: 2"
expect "allocation within the limit" "$out" "alloc limit/2: 0"
expect "NVML reports the limit" "$out" "nvmlDeviceGetMemoryInfo: total ${limit_mib} MiB"

echo "== CUDA arrays, device heap and stack count (contract §9)"
out=$(env "${vgpu_env[@]}" "$check" counts $limit_mib)
echo "$out"
expect "array over the limit refused" "$out" "array over the limit = 2"
expect "array within the limit" "$out" "array of limit/2 = 0"
limit_half=$((limit_mib / 2 + 1))
limit_quarter=$((limit_mib / 4))
expect "array held: no room for limit/2 + 1 MiB more" "$out" "array held: alloc $limit_half MiB = 2"
expect "array destroyed: room again" "$out" "array destroyed: alloc $limit_quarter MiB = 0"
expect "heap over the limit refused" "$out" "heap 2 x limit = 2"
expect "heap held: no room for limit/2 + 1 MiB more" "$out" "heap limit/2: alloc $limit_half MiB = 2"
expect "heap lowered: room again" "$out" "heap 1 MiB: alloc $limit_quarter MiB = 0"
expect "stack over the limit refused" "$out" "stack 64 KiB = 2"
expect "stack lowered: room again" "$out" "stack 1 KiB: alloc $limit_quarter MiB = 0"

echo "== virtual memory, graph memory nodes and module globals count (contract §9)"
out=$(env "${vgpu_env[@]}" "$check" vmm $limit_mib; env "${vgpu_env[@]}" "$check" graphmem $limit_mib;
	env "${vgpu_env[@]}" "$check" module $limit_mib)
echo "$out"
expect "VMM loop refused, not past the limit" "$out" "(within the limit)"
expect "graph memory node over the limit refused" "$out" "graph of limit + 64 MiB = 2"
expect "graph memory node within the limit" "$out" "graph of limit/2 = 0"
expect "graph held: no room for limit/2 + 64 MiB more" "$out" "graph held: alloc $((limit_mib / 2 + 64)) MiB = 2"
expect "graph destroyed: room again" "$out" "graph destroyed: alloc $limit_quarter MiB = 0"
expect "module of limit/2 loaded" "$out" "module of limit/2 = 0"
expect "module held: no room for limit/2 + 64 MiB more" "$out" "module held: alloc $((limit_mib / 2 + 64)) MiB = 2"
expect "module unloaded: room again" "$out" "module unloaded: alloc $limit_quarter MiB = 0"
if python3 -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
	# PyTorch's expandable segments map physical memory into one range with the VMM API
	out=$(env "${vgpu_env[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 -c '
import torch
held = []
try:
    while True:
        held.append(torch.empty(64 << 20, dtype=torch.uint8, device="cuda"))
except torch.OutOfMemoryError:
    pass
print("expandable segments: %d MiB held at the refusal" % (64 * len(held)))' 2>&1 | tail -1)
	echo "$out"
	held=$(sed -n 's/.*: \([0-9]*\) MiB held.*/\1/p' <<<"$out")
	if [ -n "$held" ] && [ "$held" -le "$limit_mib" ]; then echo "ok   PyTorch expandable segments held within the limit"
	else echo "FAIL PyTorch expandable segments: '$out' for a limit of $limit_mib MiB"; fail=1; fi
else
	echo "SKIP PyTorch expandable segments: no torch with CUDA"
fi

echo "== refusal without the container's configuration"
out=$(env "${vgpu_env[@]}" VGPU_TEST_ROOT=/nonexistent "$check" info $limit_mib 2>&1)
expect "cuInit refused with a message" "$out" "refusing to run CUDA"

echo "== context memory per process (the node-side enforcer's --enforce-slack-per-process, default 640Mi)"
ctx=$(CUDA_VISIBLE_DEVICES=0 "$check" context 0 | sed -n 's/context_bytes=//p')
if [ -n "$ctx" ] && [ "$ctx" -lt $((640 << 20)) ]; then
	echo "ok   a context with a loaded module holds $((ctx >> 20)) MiB, under the default slack"
else
	echo "FAIL a context holds '${ctx:-unknown}' bytes: the default slack (640 MiB) is too small"; fail=1
fi

echo "== the wall: an allocation past the limit through libc's own dlsym, killed by the node-side enforcer"
# The enforcer's real code (pkg/enforce) over the real driver's per-process memory (NVML), the
# tenant in a cgroup of its own: root, and the test binary built where Go is (make gpu-check-bins
# puts it in the build dir; without Go here, carry it).
config $((limit_mib << 20)) 0
enforce_test=$build/enforce-gpu.test
if [ ! -x "$enforce_test" ] && command -v go >/dev/null; then
	go test -c -tags gpu -o "$enforce_test" ./pkg/enforce/
fi
if [ ! -x "$enforce_test" ]; then
	echo "FAIL no $enforce_test and no Go to build it (make gpu-check-bins)"; fail=1
elif [ "$(id -u)" != 0 ]; then
	echo "FAIL the enforcer check makes a cgroup: run as root"; fail=1
else
	bypass="env $(printf '%q ' "${vgpu_env[@]}")$check bypass $((3 * limit_mib)) 30"
	if out=$(GPU_CHECK_BYPASS="$bypass" GPU_CHECK_UUID="$uuid" GPU_CHECK_LIMIT_MIB=$limit_mib \
		"$enforce_test" -test.run '^TestEnforcerOnGPU$' -test.v 2>&1); then
		echo "ok   $(grep -o 'killed [^(]*after the allocation around the library' <<<"$out")"
	else
		echo "FAIL the bypassing process was not killed within the bound:"; echo "$out"; fail=1
	fi
fi

echo "== overhead (best of 5; the driver alone vs preloaded)"
base=$(CUDA_VISIBLE_DEVICES=0 "$check" launch 200000 | sed -n 's/launch_ns=//p')
config 0 0
nolim=$(env "${vgpu_env[@]}" "$check" launch 200000 | sed -n 's/launch_ns=//p')
config 0 99
core=$(env "${vgpu_env[@]}" "$check" launch 200000 | sed -n 's/launch_ns=//p')
abase=$(CUDA_VISIBLE_DEVICES=0 "$check" alloc 20000 | sed -n 's/alloc_pair_ns=//p')
config $((limit_mib << 20)) 0
amem=$(env "${vgpu_env[@]}" "$check" alloc 20000 | sed -n 's/alloc_pair_ns=//p')
awk -v b="$base" -v n="$nolim" -v c="$core" -v ab="$abase" -v am="$amem" 'BEGIN {
	printf "cuLaunchKernel: driver %.0f ns, no limit +%.0f ns (target 50), core limit +%.0f ns (target 100)\n", b, n-b, c-b
	printf "cuMemAlloc+cuMemFree: driver %.0f ns, memory limit +%.0f ns (target 5000)\n", ab, am-ab }'

echo "== core limit (spinning kernel, 10 s each; utilisation = kernels/s relative to unlimited)"
cycles=${SPIN_CYCLES:-1000000}
config 0 0
full=$(env "${vgpu_env[@]}" "$check" spin 5 "$cycles" | sed -n 's/kernels_per_s=//p')
for target in 30 60; do
	config 0 $target
	got=$(env "${vgpu_env[@]}" "$check" spin 10 "$cycles" | sed -n 's/kernels_per_s=//p')
	awk -v f="$full" -v g="$got" -v t="$target" 'BEGIN {
		u = 100 * g / f; printf "target %d%%: %.1f%% (error %+.1f pp, includes start-up)\n", t, u, u - t }'
done

echo "== MIG: the plugin's code path creates and destroys a partition (mode changed only with GPU_CHECK_MIG_MODE_CHANGE=1)"
mig_test=$build/gpu-mig.test
if [ ! -x "$mig_test" ] && command -v go >/dev/null; then
	go test -c -tags gpu -o "$mig_test" ./pkg/gpu/
fi
if [ ! -x "$mig_test" ]; then
	echo "FAIL no $mig_test and no Go to build it (make gpu-check-bins)"; fail=1
elif out=$(GPU_CHECK_UUID="$uuid" "$mig_test" -test.run '^TestMIGOnGPU$' -test.v 2>&1); then
	if grep -q -- '--- SKIP' <<<"$out"; then
		echo "SKIP $(grep -o 'SKIP MIG: .*' <<<"$out" | head -n 1)"
	else
		echo "ok   $(grep -o 'MIG [^ ]* at slot .*' <<<"$out")"
	fi
else
	echo "FAIL the MIG code path:"; echo "$out"; fail=1
fi

# Issue 26's workload shapes, pair, latency and burst with PyTorch (hack/gpu-check/; about 3 min).
if why=$(python3 -c 'import torch; assert torch.cuda.is_available(), "torch.cuda.is_available() is False"' 2>&1); then
	hack/gpu-check/torch-measures.sh "$lib" "$build/test/scripted_registry_main" "$uuid" || fail=1
else
	echo "SKIP PyTorch measures: $(tail -n 1 <<<"$why")"
fi
echo "gpu-check: ${SECONDS} s (budget 8 min)"
exit $fail

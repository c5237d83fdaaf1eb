#!/usr/bin/env bash
# Issue 26's compute measures with PyTorch on a real GPU, in the units of the shared-GPU
# simulation (library/test/test_core_shared_sim.c, pkg/arbiter's latency test): utilisation in %
# of the GPU against the target and its error in percentage points, completed-work ratio for a
# pair, request latency p99 in ms and its ratio to alone. Called by hack/gpu-check.sh when torch
# sees a GPU; each run is a few seconds after 1 s of warm-up, about 2-3 minutes in all.
#
#   hack/gpu-check/torch-measures.sh <libvgpu-test.so> <scripted_registry_main> <gpu uuid>
#   hack/gpu-check/torch-measures.sh --fake      (no GPU, no torch, no library: selftest.sh)
#
# Each "container" is a container root of its own (VGPU_TEST_ROOT) with its vgpu.config and a
# scripted registry, as in gpu-check.sh. The node's compute arbiter is not part of this check:
# where a figure needs an allowance (contract §16: the burst, the best-effort neighbour) this
# script writes cores.allowance by hand, as the arbiter would. Figures print PASS or MISS against
# their targets and do not fail the check; a worker that gives no result does.
# Run lengths: GPU_CHECK_RUN_S (default 3), GPU_CHECK_PAIR_S (5), GPU_CHECK_LATENCY_S (6),
# GPU_CHECK_WARMUP_S (1).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=(python3 "$here/torch_shapes.py")
run_s=${GPU_CHECK_RUN_S:-3}
pair_s=${GPU_CHECK_PAIR_S:-5}
latency_s=${GPU_CHECK_LATENCY_S:-6}
warmup_s=${GPU_CHECK_WARMUP_S:-1}
if [ "${1:-}" = --fake ]; then
	fake=1 lib='' registry_main='' uuid=GPU-00000000-0000-0000-0000-00000000fake
else
	[ $# = 3 ] || { echo "usage: $0 <libvgpu-test.so> <scripted_registry_main> <gpu uuid> | --fake" >&2; exit 2; }
	fake=0 lib=$1 registry_main=$2 uuid=$3
fi
start=$SECONDS

work=$(mktemp -d /tmp/vgt.XXXXXX)
registries=()
# shellcheck disable=SC2317 # called by the trap
cleanup() {
	# scripted_registry_main serves from a child of its own: stop both.
	for r in "${registries[@]}"; do
		kids=()
		{ read -ra kids <"/proc/$r/task/$r/children"; } 2>/dev/null || true
		kill "${kids[@]}" "$r" 2>/dev/null || true
		wait "$r" 2>/dev/null || true
	done
	rm -rf "$work"
}
trap cleanup EXIT

# container <name>: a container root with its config directory and registry.
container() {
	local root=$work/$1
	mkdir -p "$root/etc/vgpu-dra/registry" "$root/etc/vgpu-dra/config" "$root/tmp/.vgpu_lock" "$root/tmp/.vmem_node"
	[ $fake = 1 ] && return
	"$registry_main" "$root/etc/vgpu-dra/registry/registry.sock" OK "$root/etc/vgpu-dra/config/pids.config" 0 &
	registries+=($!)
	for _ in $(seq 100); do [ -S "$root/etc/vgpu-dra/registry/registry.sock" ] && return; sleep 0.05; done
	echo "FAIL the scripted registry of container $1 did not start"; exit 1
}

# cores <container> <percent>: its vgpu.config (contract §4a), no memory limit, that core limit
# (0: none); and no allowance file, so that the library follows the request. Containers a and b
# are in pods of their own (the name is the UUID's last digit).
cores() {
	local cfg=$work/$1/etc/vgpu-dra/config
	printf 'version 1\npod 3c9d1e2f-4a5b-4c6d-8e7f-00000000000%s\ncontainer %s\ngpu 0 %s 0 %s\n' \
		"$1" "$1" "$uuid" "$2" >"$cfg/vgpu.config"
	rm -f "$cfg/cores.allowance"
}

# allowance <container> <percent>: cores.allowance as the node's arbiter writes it (contract §16).
allowance() {
	local cfg=$work/$1/etc/vgpu-dra/config
	printf 'version 1\ngpu %s %s\n' "$uuid" "$2" >"$cfg/.allowance.tmp"
	mv "$cfg/.allowance.tmp" "$cfg/cores.allowance"
}

# A run: the workers started with `worker` start measuring together once all are ready (their
# tensors, graphs and first step done); `finish` releases them and waits.
pids=()
barrier=
begin() { barrier=$(mktemp -d "$work/run.XXXXXX"); pids=(); }
# worker <container> <output file> <shape> <seconds>
worker() {
	local root=$work/$1 out=$work/$2
	shift 2
	if [ $fake = 1 ]; then
		VGPU_TEST_ROOT=$root "${py[@]}" run --fake --barrier "$barrier" --warmup "$warmup_s" "$@" >"$out" 2>&1 &
	else
		env LD_PRELOAD="$lib" VGPU_TEST_ROOT="$root" CUDA_VISIBLE_DEVICES=0 \
			"${py[@]}" run --barrier "$barrier" --warmup "$warmup_s" "$@" >"$out" 2>&1 &
	fi
	pids+=($!)
}
fail=0
finish() {
	"${py[@]}" release "$barrier" "${pids[@]}" || fail=1
	for p in "${pids[@]}"; do wait "$p" || fail=1; done
}
# figure <torch_shapes.py figure arguments>: one figure line, or FAIL with the worker's output.
figure() {
	local out
	if out=$(cd "$work" && "${py[@]}" "$@" 2>&1); then echo "$out"; else echo "FAIL $out"; fail=1; fi
}

container a
container b
echo "== compute shapes with PyTorch (issue 26 §3): ${run_s} s runs after ${warmup_s} s of warm-up;"
echo "   utilisation = work done relative to an unlimited run of the same loop"

# 1. One large synchronous kernel per step (the shape that escapes a sampler, HAMi#2863).
cores a 0
begin; worker a sync-full sync "$run_s"; finish
for t in 10 30 50 90; do
	cores a $t
	begin; worker a sync-$t sync "$run_s"; finish
	figure util "large matmul + synchronize" $t --full sync-full --got sync-$t
done

# 2. A CUDA graph of many small kernels, replayed (one launch stands for 100 kernels).
cores a 0
begin; worker a graph-full graph "$run_s"; finish
cores a 30
begin; worker a graph-30 graph "$run_s"; finish
figure util "CUDA graph of 100 matmuls" 30 --full graph-full --got graph-30

# 3. Four processes of one container with small asynchronous kernels, limited together.
cores a 0
begin; for i in 1 2 3 4; do worker a async-full-$i async "$run_s"; done; finish
cores a 50
begin; for i in 1 2 3 4; do worker a async-50-$i async "$run_s"; done; finish
figure util "4 processes, small async kernels" 50 --full async-full-{1,2,3,4} --got async-50-{1,2,3,4}

# 4. Two containers at 10 and 90 running the same fixed-size kernels at once (HAMi#2863's method).
cores a 0
begin; worker a fixed-full fixed "$run_s"; finish
cores a 10
cores b 90
begin; worker a pair-10 fixed "$pair_s"; worker b pair-90 fixed "$pair_s"; finish
figure pair 10 90 --low-out pair-10 --high-out pair-90 --full fixed-full

# 5. A guaranteed share (request 60) serving requests that arrive at random, alone and beside a
# best-effort share (request 10) that saturates the GPU; the best-effort one's allowance is its
# request, what the arbiter gives it while the guaranteed one is busy.
cores a 60
begin; worker a latency-alone requests "$latency_s"; finish
cores b 10
allowance b 10
begin
worker a latency-beside requests "$latency_s"
worker b latency-neighbour fixed "$(awk -v s="$latency_s" 'BEGIN { print s + 1 }')"
finish
figure latency --alone latency-alone --beside latency-beside --neighbour latency-neighbour --full fixed-full

# 6. A burst: request 30, the allowance 100 the arbiter lends a share alone on the GPU.
cores a 30
allowance a 100
begin; worker a burst fixed "$run_s"; finish
figure burst 30 100 --full fixed-full --got burst

echo "PyTorch measures: $((SECONDS - start)) s"
exit $fail

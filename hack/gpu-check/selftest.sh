#!/usr/bin/env bash
# The PyTorch part of hack/gpu-check.sh without a GPU: torch_shapes.py's own checks, then
# torch-measures.sh end to end on the fake GPU (no torch, no library), which follows the config
# and allowance files the script writes as the library would. Checks that every figure is
# printed, in its units, from the files of the right container: the burst follows its
# allowance (not its request), and the pair's containers follow their own limits. The bounds
# are wide (a factor of 2 and more from what a wrong file would give); nothing else is timed.
#
#   hack/gpu-check/selftest.sh          (about 25 s; not part of make test)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
python3 "$here/torch_shapes.py" --selftest

echo "== torch-measures.sh --fake"
status=0
out=$(GPU_CHECK_RUN_S=0.5 GPU_CHECK_PAIR_S=0.5 GPU_CHECK_LATENCY_S=1 GPU_CHECK_WARMUP_S=0.1 \
	"$here/torch-measures.sh" --fake 2>&1) || status=$?
echo "$out"
fail=0
check() { # check <what> <extended regexp the output must match>
	if grep -qE -- "$2" <<<"$out"; then echo "ok   $1"; else echo "FAIL $1: no line matches '$2'"; fail=1; fi
}
num='[0-9]+\.[0-9]'
verdict='(PASS|MISS)$'
if [ "$status" = 0 ]; then echo "ok   torch-measures.sh --fake exits 0"; else echo "FAIL torch-measures.sh --fake exited $status"; fail=1; fi
for t in 10 30 50 90; do
	check "large synchronous kernel at $t" "^large matmul \+ synchronize +target $t%: +$num% \(error +[-+]$num pp\) $verdict"
done
check "CUDA graph at 30" "^CUDA graph of 100 matmuls +target 30%: +$num% \(error +[-+]$num pp\) $verdict"
check "4 processes at 50" "^4 processes, small async kernels +target 50%: +$num% \(error +[-+]$num pp\) $verdict"
check "10:90 pair" "^two containers at 10% and 90%: GPU share $num% / $num%, completed kernels 1:$num+ \(target 1:9 \+-10 %\) $verdict"
check "latency p99 alone, beside, ratio" "^guaranteed request latency p99: alone $num ms, beside best-effort $num ms, x$num+ \(target <= 1.10\) (PASS|MISS); best-effort at $num% of the GPU$"
check "burst" "^burst: request 30%, allowance 100%, alone: $num% of the GPU \(target >= 90%\) $verdict"
check "elapsed time" "^PyTorch measures: [0-9]+ s$"
if grep -q '^FAIL' <<<"$out"; then echo "FAIL a FAIL line above"; fail=1; fi
burst=$(sed -n 's/^burst: .*alone: \([0-9.]*\)% .*/\1/p' <<<"$out")
ratio=$(sed -n 's/^two containers .*kernels 1:\([0-9.]*\) .*/\1/p' <<<"$out")
if awk -v b="${burst:-0}" 'BEGIN { exit !(b >= 60) }'; then
	echo "ok   the burst followed cores.allowance (100), not the request (30): $burst%"
else
	echo "FAIL the burst ran at ${burst:-?}%: cores.allowance not followed"; fail=1
fi
if awk -v r="${ratio:-0}" 'BEGIN { exit !(r >= 4 && r <= 20) }'; then
	echo "ok   each container of the pair followed its own vgpu.config: 1:$ratio"
else
	echo "FAIL the pair completed 1:${ratio:-?}: the containers' files are mixed up"; fail=1
fi
if [ $fail = 0 ]; then echo "selftest.sh: PASS"; else echo "selftest.sh: FAIL"; fi
exit $fail

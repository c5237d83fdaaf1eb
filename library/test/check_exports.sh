#!/bin/sh
# The library exports exactly dlsym, dlvsym and the hooks of src/hook_list.h (version script), and
# nothing runs at load time (no constructors / init arrays of its own).
set -eu
so="$1"
list="$2"
want=$( { echo dlsym; echo dlvsym; sed -n '/^#define VGPU_CUDA_HOOKS/,/^$/p; /^#define VGPU_NVML_HOOKS/,/^$/p' "$list" |
	grep -oE '^[[:space:]]*X\((cu|nvml)[A-Za-z0-9_]+' | sed 's/.*X(//'; } | sort)
have=$(nm -D --defined-only "$so" | awk '{print $3}' | grep -v '^$' | sort)
if [ "$want" != "$have" ]; then
	echo "FAIL: exported symbols differ from hook_list.h (< wanted, > exported):"
	tmp=$(mktemp -d)
	echo "$want" >"$tmp/want"
	echo "$have" >"$tmp/have"
	diff "$tmp/want" "$tmp/have" || true
	rm -rf "$tmp"
	exit 1
fi
# .init_array holds only the toolchain's frame_dummy entry: one pointer
init=$(readelf -S -W "$so" | awk '$2==".init_array"{print $6}')
if [ -n "$init" ] && [ $((0x$init)) -gt 8 ]; then
	echo "FAIL: $so has constructors (.init_array of 0x$init bytes)"
	exit 1
fi
echo "ok: $so exports $(echo "$have" | wc -l) symbols, no constructors"

#!/bin/sh
# The preloaded library must load on images with glibc 2.28 (UBI 8) and 2.31 (Ubuntu 20.04):
# no versioned glibc symbol newer than GLIBC_2.28, and libdl.so.2 NEEDED (before glibc 2.34
# the dl* functions live there). Checks the built .so with objdump and readelf.
set -eu
so="$1"
max_major=2
max_minor=28
bad=$(objdump -T "$so" | grep -oE 'GLIBC_[0-9]+\.[0-9]+(\.[0-9]+)?' | sort -u | while read -r v; do
	n=${v#GLIBC_}
	major=${n%%.*}
	rest=${n#*.}
	minor=${rest%%.*}
	if [ "$major" -gt "$max_major" ] || { [ "$major" -eq "$max_major" ] && [ "$minor" -gt "$max_minor" ]; }; then
		objdump -T "$so" | grep "$v" | sed 's/^/  /'
	fi
done)
if [ -n "$bad" ]; then
	echo "FAIL: $so needs glibc symbols newer than GLIBC_$max_major.$max_minor:"
	echo "$bad"
	exit 1
fi
if objdump -T "$so" | grep -q 'GLIBC_PRIVATE'; then
	echo "FAIL: $so uses GLIBC_PRIVATE symbols"
	exit 1
fi
if ! readelf -d "$so" | grep -q 'NEEDED.*\[libdl\.so\.2\]'; then
	echo "FAIL: $so does not name libdl.so.2 as NEEDED"
	exit 1
fi
newest=$(objdump -T "$so" | grep -oE 'GLIBC_[0-9.]+' | sort -u -V | tail -1)
echo "ok: $so needs at most $newest"

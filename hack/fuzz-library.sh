#!/usr/bin/env bash
# make fuzz-long: runs the library's libFuzzer targets (library/test/fuzz) for DURATION each,
# under ASan and UBSan. Needs clang with libFuzzer (Debian: clang, libclang-rt-14-dev), installed
# when missing. New inputs that widened coverage stay in _output/library-fuzz/corpus; a crasher
# is written to _output/library-fuzz/ and must be added to library/test/fuzz/corpus/<target>/,
# where every `make test` replays it.
#
# Usage: hack/fuzz-library.sh [DURATION]   (Go duration form: 30s, 10m; default 10m)
set -euo pipefail
cd "$(dirname "$0")/.."

duration="${1:-10m}"
case "${duration}" in
  *m) seconds=$(( ${duration%m} * 60 )) ;;
  *s) seconds=${duration%s} ;;
  *) echo "fuzz-library: duration ${duration}: want e.g. 30s or 10m" >&2; exit 2 ;;
esac

if ! command -v clang >/dev/null || ! echo 'int LLVMFuzzerTestOneInput(const char*d,unsigned long n){return 0;}' |
  clang -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then
  echo "fuzz-library: installing clang with libFuzzer" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq clang libclang-rt-14-dev >/dev/null
fi

build=_output/library-fuzz
CC=clang cmake -S library -B "${build}" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DVGPU_FUZZ=ON >/dev/null
cmake --build "${build}" -j2 --target fuzz_config >/dev/null

for target in config; do
  corpus="${build}/corpus/${target}"
  mkdir -p "${corpus}"
  echo "fuzz-library: fuzz_${target} for ${duration}" >&2
  # The repository's corpus seeds the run (read-only); new inputs go to the build's corpus.
  (cd "${build}" && "test/fuzz_${target}" -max_total_time="${seconds}" -print_final_stats=1 \
    "corpus/${target}" "${OLDPWD}/library/test/fuzz/corpus/${target}")
done

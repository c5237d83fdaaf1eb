#!/usr/bin/env bash
# Installs, from Debian's archive, what `make test` needs besides Go: gcc (cgo, the C library),
# cmake/ctest (the library suite) and binutils (readelf/objdump for its symbol checks). Only
# missing packages are installed; when nothing is missing this makes no network call.
set -euo pipefail

log() { printf '[install-test-deps %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

main() {
  local pair missing=()
  for pair in gcc:gcc make:make cmake:cmake ctest:cmake readelf:binutils objdump:binutils; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  (( ${#missing[@]} == 0 )) && return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  [[ ${EUID} -eq 0 ]] || { log "missing ${missing[*]}; run as root to install them"; exit 1; }
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

main "$@"

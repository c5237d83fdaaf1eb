#!/usr/bin/env bash
# Installs, from Debian's archive, what `make test` needs besides Go: gcc (cgo, the C library),
# cmake/ctest (the library suite), binutils (readelf/objdump for its symbol checks) and
# prometheus (promtool tests the chart's alert rules; make e2e runs the prometheus binary).
# Only missing packages are installed; when nothing is missing this makes no network call.
set -euo pipefail

log() { printf '[install-test-deps %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# Debian's prometheus package starts a Prometheus server on :9090 when it is installed. Tests
# only need its binaries: a policy-rc.d that answers 101 ("action forbidden") keeps
# invoke-rc.d and deb-systemd-invoke from starting it. An administrator's own policy-rc.d is
# left alone (and then decides).
install_packages() {
  local policy=/usr/sbin/policy-rc.d ours=""
  if [[ ! -e "${policy}" ]]; then
    printf '#!/bin/sh\nexit 101\n' >"${policy}"
    chmod 0755 "${policy}"
    ours=1
  fi
  local rc=0
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null || rc=$?
  [[ -z "${ours}" ]] || rm -f "${policy}"
  return "${rc}"
}

main() {
  local pair missing=()
  for pair in gcc:gcc make:make cmake:cmake ctest:cmake readelf:binutils objdump:binutils promtool:prometheus prometheus:prometheus; do
    command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
  done
  (( ${#missing[@]} == 0 )) && return 0
  mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
  [[ ${EUID} -eq 0 ]] || { log "missing ${missing[*]}; run as root to install them"; exit 1; }
  log "installing ${missing[*]}"
  install_packages "${missing[@]}"
}

main "$@"

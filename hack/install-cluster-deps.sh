#!/usr/bin/env bash
# Installs, from Debian's archive, what the local cluster needs besides the binaries that
# hack/build-cluster-bins.sh builds: runc, the CNI plugins, a static busybox for the test image,
# gcc and libc6-dev for the static pause binary, iptables, openssl and the like. Only missing
# packages are installed; when nothing is missing this makes no network call. Needs root.
set -euo pipefail

log() { printf '[install-cluster-deps %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

# package_is_needed PACKAGE: true when what PACKAGE provides is missing.
package_is_needed() {
  case "$1" in
    runc) ! command -v runc >/dev/null ;;
    containernetworking-plugins) [[ ! -x /usr/lib/cni/bridge ]] ;;
    # The test image needs busybox itself to be static (Debian's "busybox" package is not).
    busybox-static) ! { command -v busybox >/dev/null && file -L "$(command -v busybox)" | grep -q 'statically linked'; } ;;
    iptables) ! command -v iptables-restore >/dev/null ;;
    gcc) ! command -v gcc >/dev/null ;;
    libc6-dev) [[ ! -f /usr/lib/x86_64-linux-gnu/libc.a && ! -f /usr/lib/aarch64-linux-gnu/libc.a ]] ;;
    openssl) ! command -v openssl >/dev/null ;;
    curl) ! command -v curl >/dev/null ;;
    iproute2) ! command -v ip >/dev/null || ! command -v ss >/dev/null ;;
    file) ! command -v file >/dev/null ;;
    *) return 0 ;;
  esac
}

main() {
  local pkg missing=()
  for pkg in runc containernetworking-plugins busybox-static iptables gcc libc6-dev openssl curl iproute2 file; do
    package_is_needed "${pkg}" && missing+=("${pkg}")
  done
  if (( ${#missing[@]} == 0 )); then
    return 0
  fi
  [[ ${EUID} -eq 0 ]] || { log "missing ${missing[*]}; run as root to install them"; exit 1; }
  log "installing ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
}

main "$@"

#!/usr/bin/env bash
# Fault injection for the chaos suite: fills the plugin's state dir's file system to the last
# block and the last inode, so that creating a claim directory fails with ENOSPC, and frees it.
# It only ever fills the small file system the chaos suite mounts there (cluster-up with
# VGPU_DRA_STATE_DIR_SIZE), never a disk the node shares with anything else. Each claim's own
# tmpfs, below it, is not touched: running containers keep working.
#
# Usage: hack/chaos/state-fs.sh fill|free
set -euo pipefail

export LOG_NAME=chaos-state-fs
CHAOS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=hack/lib/cluster.sh
source "${CHAOS_DIR}/../lib/cluster.sh"

readonly FILL_DIR="${PLUGIN_STATE_DIR}/.chaos-fill"

# state_dir_fstype prints the type of the file system mounted at the state dir itself (empty
# when it is not a mount point; the last of several stacked mounts wins).
state_dir_fstype() {
  awk -v d="${PLUGIN_STATE_DIR}" '$5 == d { for (i = 7; i <= NF; i++) if ($i == "-") { t = $(i + 1); break } } END { print t }' \
    /proc/self/mountinfo
}

fill() {
  local i=0 err try
  [[ "$(state_dir_fstype)" == tmpfs ]] ||
    die "${PLUGIN_STATE_DIR} is not the chaos suite's own tmpfs (cluster-up with VGPU_DRA_STATE_DIR_SIZE): refusing to fill it"
  mkdir -p "${FILL_DIR}"
  # Every block, then every inode (a directory on tmpfs takes an inode and no block). The
  # plugin frees some while this runs (an unprepared claim's directory is removed in the
  # background, a checkpoint's temporary file renamed away): a probe that still gets a
  # directory keeps it, and the fill goes on, a few times before it gives up.
  for try in 1 2 3 4 5; do
    dd if=/dev/zero of="${FILL_DIR}/blocks-${try}" bs=1M status=none 2>/dev/null || true
    while : 2>/dev/null >"${FILL_DIR}/inode-${i}"; do i=$((i + 1)); done
    if ! err="$(mkdir "${FILL_DIR}/probe-${try}" 2>&1)"; then
      log "filled ${PLUGIN_STATE_DIR} ($((i)) inodes taken, ${try} round(s); mkdir now says: ${err##*: })"
      return 0
    fi
  done
  free # never leave the node's state full behind a failed injection
  die "${PLUGIN_STATE_DIR} still takes a new directory after filling it ${try} times"
}

free() {
  rm -rf --one-file-system "${FILL_DIR}"
  log "freed ${PLUGIN_STATE_DIR}: $(df -h --output=avail "${PLUGIN_STATE_DIR}" | tail -n 1 | tr -d ' ') and $(df --output=iavail "${PLUGIN_STATE_DIR}" | tail -n 1 | tr -d ' ') inodes available"
}

main() {
  require_root
  case "${1:-}" in
    fill) fill ;;
    free) free ;;
    *) die "usage: $0 fill|free" ;;
  esac
}

main "$@"

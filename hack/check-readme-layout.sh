#!/usr/bin/env bash
# make lint: every package that `go list ./...` prints is named in the package map,
# docs/reference/code-layout.md ("How the code is laid out", linked from the README), and every
# cmd/, pkg/ or test/ path the map names exists, so the map a newcomer reads stays true.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
map=docs/reference/code-layout.md
section=$(sed -n '/^# How the code is laid out/,$p' "${map}")
if [[ -z "${section}" ]]; then
  echo "${map}: no \"# How the code is laid out\" heading" >&2
  exit 1
fi
rc=0
for pkg in $(go list ./...); do
  rel=${pkg#"${module}/"}
  if ! grep -qE "(^|[ ,])${rel}([ ,]|$)" <<<"${section}"; then
    echo "${map}: package ${rel} is missing from \"How the code is laid out\"" >&2
    rc=1
  fi
done
for path in $(grep -oE '(^|[ `])(cmd|pkg|test)/[A-Za-z0-9_/.-]+' <<<"${section}" | tr -d ' `' | sort -u); do
  if [[ ! -e "${path}" ]]; then
    echo "${map}: \"How the code is laid out\" names ${path}, which does not exist" >&2
    rc=1
  fi
done
exit "${rc}"

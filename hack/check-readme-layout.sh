#!/usr/bin/env bash
# make lint: every package that `go list ./...` prints is named in the README's "How the code is
# laid out" section, and every cmd/, pkg/ or test/ path the section names exists, so the map a
# newcomer reads first stays true.
set -euo pipefail
cd "$(dirname "$0")/.."
module=$(go list -m)
section=$(sed -n '/^## How the code is laid out/,/^## /p' README.md)
rc=0
for pkg in $(go list ./...); do
  rel=${pkg#"${module}/"}
  if ! grep -qE "(^|[ ,])${rel}([ ,]|$)" <<<"${section}"; then
    echo "README.md: package ${rel} is missing from \"How the code is laid out\"" >&2
    rc=1
  fi
done
for path in $(grep -oE '(^|[ `])(cmd|pkg|test)/[A-Za-z0-9_/.-]+' <<<"${section}" | tr -d ' `' | sort -u); do
  if [[ ! -e "${path}" ]]; then
    echo "README.md: \"How the code is laid out\" names ${path}, which does not exist" >&2
    rc=1
  fi
done
exit "${rc}"

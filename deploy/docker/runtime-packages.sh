#!/bin/sh
# Prints the packages (Debian or Ubuntu) that hold the shared libraries the given programs load, one per
# line, sorted: what a runtime image must install for them and nothing more. Run in the build stage of an
# image, after the build; the final stage installs the list. Libraries that no package holds, and
# libraries ldd cannot find (the CUDA driver's libcuda, which the GPU node provides), are left out, with
# a note on stderr.
#   deploy/docker/runtime-packages.sh PROGRAM... > runtime-packages.txt
set -eu
if [ $# -eq 0 ]; then
  echo "usage: $0 PROGRAM..." >&2
  exit 2
fi

for prog in "$@"; do
  if ! ldd "$prog" >/dev/null 2>&1; then
    echo "runtime-packages: $prog is not a dynamically linked program ldd can read" >&2
    exit 1
  fi
done

# owner PATH: the package that installed PATH, trying the /lib and /usr/lib spellings of merged-/usr systems.
owner() {
  for p in "$1" "/usr$1" "${1#/usr}" "$(readlink -f "$1")"; do
    pkg=$(dpkg-query -S "$p" 2>/dev/null | grep -v "^diversion" | head -n 1 | cut -d: -f1) || true
    if [ -n "$pkg" ]; then
      echo "$pkg"
      return 0
    fi
  done
  return 1
}

for prog in "$@"; do
  ldd "$prog"
done | while read -r name arrow path rest; do
  if [ "$arrow" = "=>" ] && [ "$path" = "not" ]; then
    echo "runtime-packages: $name not found by ldd; left out (the host or base image must provide it)" >&2
  elif [ "$arrow" = "=>" ] && [ "${path#/}" != "$path" ]; then
    owner "$path" || echo "runtime-packages: no package holds $path; left out" >&2
  fi
done | sort -u

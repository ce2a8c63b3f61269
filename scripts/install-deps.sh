#!/usr/bin/env bash
# Installs what ztrain needs to build and test on Debian 12 (run as root; safe to run again).
#   - Debian packages: compiler, CMake, and the libraries ztrain links (cJSON, cmocka, ...).
#   - A Python virtual environment in .venv with the pinned reference libraries the tests compare
#     ztrain against (numpy, safetensors). Nothing from it is linked into ztrain.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libcjson-dev libcmocka-dev
  python3 python3-venv python3-pip
)
PIP_PACKAGES=(numpy==1.26.4 safetensors==0.4.5)

log() { printf 'install-deps: %s\n' "$*"; }

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" -ne 0 ]; then
    log "missing Debian packages: ${missing[*]}; run this script as root (or: sudo apt-get install ${missing[*]})"
    exit 1
  fi
  log "installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
else
  log "Debian packages present"
fi

# Debian's own Python (the venv must not depend on a Python installed by hand).
PY=/usr/bin/python3
[ -x "$PY" ] || PY=$(command -v python3)
if ! .venv/bin/python3 -c 'import numpy, safetensors' 2>/dev/null ||
   [ "$(.venv/bin/python3 -c 'import numpy, safetensors; print(numpy.__version__, safetensors.__version__)')" != "1.26.4 0.4.5" ]; then
  log "creating .venv with ${PIP_PACKAGES[*]}"
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
else
  log ".venv present"
fi
log "done"

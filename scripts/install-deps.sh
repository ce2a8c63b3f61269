#!/usr/bin/env bash
# Installs what ztrain needs to build and test on Debian 12 (run as root; safe to run again).
#   - Debian packages: compiler, CMake, and the libraries ztrain links (cJSON, cmocka, ...); clang and
#     libomp-dev build the fuzzing harnesses (bench/fuzz/run.sh).
#   - A Python virtual environment in .venv with the pinned reference libraries the tests compare
#     ztrain against (numpy, safetensors, tokenizers; transformers without PyTorch and jinja2 for the chat
#     templates' apply_chat_template), and the deploy tests' validators (kubernetes-validate, PyYAML,
#     dockerfile). Nothing from it is linked into ztrain.
#   - With ZT_WITH_TORCH=1, PyTorch too (PyPI's wheel, about 5 GB with its CUDA libraries), so that the
#     interop tests that run transformers' own models (ctest -L interop: LLaMA, Qwen2, GPT-NeoX, T5, SFT,
#     packing, export) run instead of skipping.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(
  build-essential cmake pkg-config git ca-certificates
  libcjson-dev libcmocka-dev
  libgrpc-dev libprotobuf-c-dev protobuf-c-compiler liburing-dev
  python3 python3-venv python3-pip
  openssl
  clang libomp-dev
)
# The deploy tests render the Kubernetes manifests with `kubectl kustomize`: Debian's kubernetes-client,
# unless a kubectl is already installed (another vendor's package would clash over /usr/bin/kubectl).
command -v kubectl >/dev/null 2>&1 || APT_PACKAGES+=(kubernetes-client)
PIP_PACKAGES=(numpy==1.26.4 safetensors==0.8.0
  kubernetes-validate==1.37.0 PyYAML==6.0.2 dockerfile==3.4.0
  grpcio==1.76.0 grpcio-tools==1.76.0 grpcio-health-checking==1.76.0 protobuf==6.33.0
  tokenizers==0.23.3 transformers==5.23.0 jinja2==3.1.6)
[ "${ZT_WITH_TORCH:-0}" = 1 ] && PIP_PACKAGES+=(torch==2.15.0)

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
# The venv is made again unless every package of PIP_PACKAGES is installed at its pinned version.
if ! .venv/bin/python3 - "${PIP_PACKAGES[@]}" 2>/dev/null <<'EOF'
import sys
from importlib.metadata import version
sys.exit(any(version(name) != pin for name, pin in (p.split("==") for p in sys.argv[1:])))
EOF
then
  log "creating .venv with ${PIP_PACKAGES[*]}"
  rm -rf .venv
  "$PY" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check "${PIP_PACKAGES[@]}"
else
  log ".venv present"
fi
log "done"

#!/usr/bin/env bash
# Installs the dependencies, builds ztrain with its tests, and runs the whole test suite with ctest.
#   ZT_CUDA_ARCHS   CUDA architectures to build when nvcc is present (default: all release ones)
#   ZT_BUILD_DIR    build folder (default: build)
# GPU tests are skipped (exit 77) on a machine without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

build=${ZT_BUILD_DIR:-build}
args=(-DCMAKE_BUILD_TYPE=Release -DZT_BUILD_TESTS=ON -DZT_CUDA=AUTO)  # explicit: a cached OFF must not stick
[ -n "${ZT_CUDA_ARCHS:-}" ] && args+=("-DZT_CUDA_ARCHS=${ZT_CUDA_ARCHS}")
cmake -S . -B "$build" "${args[@]}"
cmake --build "$build" -j "$(nproc)"
cd "$build"
ctest --output-on-failure --timeout 900 -j "$(nproc)"

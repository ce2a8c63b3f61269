#!/usr/bin/env bash
# Encoding speed of ztrain's tokenizer.json tokenizers against the Hugging Face tokenizers library, on the
# bundled corpus. Usage: bench/tokenize/run.sh [BUILD_DIR] [ROUNDS]   (BUILD_DIR default: build)
# Needs the .venv of scripts/install-deps.sh (tokenizers) and a Release build with the tests
# (cmake --build BUILD_DIR --target hf_tokenizer_tool).
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
tool="$build/tests/worker/hf_tokenizer_tool"
[ -x "$tool" ] || { echo "no $tool: build it with cmake --build $build --target hf_tokenizer_tool" >&2; exit 1; }
exec .venv/bin/python3 bench/tokenize/bench_tokenizers.py "$tool" "${2:-5}"

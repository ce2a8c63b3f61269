#!/usr/bin/env bash
# The ztrain demo: installs the dependencies, builds ztrain, and trains a small GPT-2 (4 layers x 256,
# byte vocabulary) on the bundled public-domain corpus (data/corpus.txt) on the CPU, printing progress and
# validation loss; then generates a sample and draws the loss curve.
#   ZT_DEMO_DIR   where the run goes (default: runs/demo; an earlier demo run there is replaced)
#   ZT_DEMO_STEPS override the number of training steps
#   ZT_DEMO_BUILD build folder (default: build-demo, a CPU-only build kept apart from the test build)
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh

build=${ZT_DEMO_BUILD:-build-demo}
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DZT_BUILD_TESTS=OFF -DZT_CUDA=OFF
cmake --build "$build" -j "$(nproc)" --target ztrain
zt=./$build/worker/ztrain

run=${ZT_DEMO_DIR:-runs/demo}
rm -rf "$run"
$zt tokenize --input data/corpus.txt --out-dir "$run/data" --name corpus --val-fraction 0.05
steps=()
[ -n "${ZT_DEMO_STEPS:-}" ] && steps=(--steps "$ZT_DEMO_STEPS")
$zt train --config examples/demo.json --train-data "$run/data/corpus_train_*.bin" \
  --val-data "$run/data/corpus_val_*.bin" --out "$run" "${steps[@]}"
echo
echo "=== sample from the trained model ==="
$zt generate --checkpoint "$run" --prompt "And God said" --max-new-tokens 300 --temperature 0.8 --top-k 40 --seed 1
echo
$zt plot --metrics "$run/metrics.jsonl" --out "$run/loss.svg" --title "ztrain demo: GPT-2 4x256 on the KJV Bible"
echo "loss curve: $run/loss.svg"

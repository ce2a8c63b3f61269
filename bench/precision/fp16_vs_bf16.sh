#!/bin/bash
# GPT-2 124M architecture (12 x 768, T 512) with the byte vocabulary on the bundled corpus: bf16 with two
# seeds (the noise between seeds) and fp16 with dynamic loss scaling, same data and schedule.
set -u
# Usage: bench/precision/fp16_vs_bf16.sh [path to a CUDA-enabled ztrain] (run from the repository root).
Z=${1:-$PWD/build/worker/ztrain}
W=/tmp/fb; rm -rf $W; mkdir -p $W
cat > $W/model.json <<'J'
{"model_type": "gpt2", "n_layer": 12, "n_head": 12, "n_embd": 768, "n_positions": 1024, "vocab_size": 256,
 "layer_norm_epsilon": 1e-05, "tie_word_embeddings": true}
J
$Z tokenize --input data/corpus.txt --out-dir $W/data --name c > /dev/null
common="--model $W/model.json --train-data $W/data/c_train_*.bin --val-data $W/data/c_val_*.bin --device cuda
  --steps 600 --batch-size 16 --seq-len 512 --lr 6e-4 --warmup 60 --eval-every 100 --eval-batches 16
  --log-every 100 --save-every 0"
for run in "bf16 1" "bf16 2" "fp16 1"; do
  set -- $run
  echo "=== precision $1 seed $2"
  $Z train $common --precision $1 --seed $2 --out $W/run_$1_$2 2>&1 | grep -E "eval:|done:|skipped|loss scale|memory plan|error" 
done

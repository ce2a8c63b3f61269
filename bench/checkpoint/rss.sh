#!/usr/bin/env bash
# Peak RSS of a CPU run whose Adam moments (and, under --host-mem, fp32 masters) live on disk, with and without
# its checkpoint, so that the difference is what writing the checkpoint holds in RAM: a GPT-2 of 12 layers x
# 1024 over bytes (151M parameters, 604 MB of fp32 weights), 2 steps of 1 x 32 tokens, one final checkpoint.
#   bench/checkpoint/rss.sh [ZTRAIN] [WORK_DIR] [extra ztrain flags, e.g. --host-mem 2500MiB]
# Prints one line per run: "ckpt|nockpt peak_rss_kib=N wall_s=S".
set -euo pipefail
ZTRAIN=${1:-build/worker/ztrain}
WORK=${2:-/tmp/zt_ckpt_rss}
shift $(( $# > 2 ? 2 : $# )) || true
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
mkdir -p "$WORK"
[ -f "$WORK/data_train_000.bin" ] || "$PY" "$HERE/../make_shards.py" "$WORK/data" 200000 256
cat > "$WORK/model.json" <<'JSON'
{"model_type": "gpt2", "n_layer": 12, "n_head": 16, "n_embd": 1024, "n_positions": 64, "vocab_size": 256,
 "tie_word_embeddings": true}
JSON
for mode in ckpt nockpt; do
    rm -rf "$WORK/run_$mode" "$WORK/state"
    mkdir -p "$WORK/state"
    save=0
    [ "$mode" = nockpt ] && save=-1
    /usr/bin/time -f "%M %e" -o "$WORK/time_$mode" "$ZTRAIN" train --model "$WORK/model.json" \
        --train-data "$WORK/data_train_000.bin" --steps 2 --batch-size 1 --seq-len 32 --log-every 1 \
        --moments-dir "$WORK/state" --save-every "$save" --out "$WORK/run_$mode" "$@" > "$WORK/log_$mode" 2>&1 ||
        { tail -5 "$WORK/log_$mode"; exit 1; }
    read -r rss wall < "$WORK/time_$mode"
    echo "$mode peak_rss_kib=$rss wall_s=$wall"
done

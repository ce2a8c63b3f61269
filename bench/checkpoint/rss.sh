#!/usr/bin/env bash
# Peak RSS of a CPU run whose Adam moments (and, under --host-mem, fp32 masters) live on disk, with and without
# its checkpoint, so that the difference is what writing the checkpoint holds in RAM: a GPT-2 of 12 layers x
# 1024 over bytes (151M parameters, 604 MB of fp32 weights), 2 steps of 1 x 32 tokens, one final checkpoint;
# then the run resumed from that checkpoint for one more step without writing another, so that its peak is
# what reading the checkpoint holds (the whole state in host arrays, or a block's shards when streamed).
#   bench/checkpoint/rss.sh [ZTRAIN] [WORK_DIR] [extra ztrain flags, e.g. --host-mem 2500MiB]
# Prints one line per run: "ckpt|nockpt|resume peak_rss_kib=N wall_s=S" (resume: "load=streamed|whole", from
# the log).
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
for mode in ckpt nockpt resume; do
    rm -rf "$WORK/state"
    mkdir -p "$WORK/state"
    save=0 steps=2 run_dir="$WORK/run_$mode" resume=()
    [ "$mode" = nockpt ] && save=-1
    [ "$mode" = resume ] && save=-1 steps=3 run_dir="$WORK/run_ckpt" resume=(--resume "$WORK/run_ckpt")
    [ "$mode" = resume ] || rm -rf "$run_dir"
    /usr/bin/time -f "%M %e" -o "$WORK/time_$mode" "$ZTRAIN" train --model "$WORK/model.json" \
        --train-data "$WORK/data_train_000.bin" --steps "$steps" --batch-size 1 --seq-len 32 --log-every 1 \
        --moments-dir "$WORK/state" --save-every "$save" --out "$run_dir" "${resume[@]}" "$@" > "$WORK/log_$mode" 2>&1 ||
        { tail -5 "$WORK/log_$mode"; exit 1; }
    read -r rss wall < "$WORK/time_$mode"
    load=""
    [ "$mode" = resume ] && load=" load=$(grep -q 'checkpoint read into the engine' "$WORK/log_$mode" && echo streamed || echo whole)"
    echo "$mode peak_rss_kib=$rss wall_s=$wall$load"
done

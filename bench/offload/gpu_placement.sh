#!/usr/bin/env bash
# GPT-2 124M on one GPU with the optimizer on the GPU and on the host (--optimizer cpu), for one or more
# ztrain binaries side by side, in alternating rounds; prints a table of tokens/s per binary, placement,
# precision and round.
#   bench/offload/gpu_placement.sh [OUT_DIR]
# Environment:
#   ZTRAINS     "label=path ..." binaries to compare (default "ztrain=build/worker/ztrain")
#   PLACEMENTS  optimizer placements (default "gpu cpu")
#   PRECISIONS  compute types (default "bf16")
#   ROUNDS      alternating rounds (default 2)
#   STEPS       steps per run (default 30; tokens/s is the mean over steps 11..STEPS), BATCH (default 16)
# Needs python3 with numpy (random token shards, bench/make_shards.py).
set -eu
HERE="$(cd "$(dirname "$0")/.." && pwd)"
RESULT_DIR="${1:-bench-out-placement}"
ZTRAINS="${ZTRAINS:-ztrain=build/worker/ztrain}"
PLACEMENTS="${PLACEMENTS:-gpu cpu}"
PRECISIONS="${PRECISIONS:-bf16}"
ROUNDS="${ROUNDS:-2}"
STEPS="${STEPS:-30}"
BATCH="${BATCH:-16}"
mkdir -p "$RESULT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || python3 "$HERE/make_shards.py" "$DATA/rnd" 4000000
RES="$RESULT_DIR/placement.tsv"
: >"$RES"
for round in $(seq 1 "$ROUNDS"); do
  for prec in $PRECISIONS; do
    for place in $PLACEMENTS; do
      for entry in $ZTRAINS; do
        label=${entry%%=*} bin=${entry#*=} run="${TMPDIR:-/tmp}/zt_bench_placement"
        rm -rf "$run"
        log="$RESULT_DIR/${label}_${place}_${prec}_r${round}.log"
        "$bin" train --model "$HERE/gpt2-124m.json" --train-data "$DATA/rnd_train_000.bin" --device cuda \
          --precision "$prec" --optimizer "$place" --steps "$STEPS" --batch-size "$BATCH" --seq-len 1024 \
          --out "$run" --save-every 0 --eval-every 0 --log-every 10 >"$log" 2>&1 || { echo "failed: see $log"; exit 1; }
        tps=$(python3 - "$run/metrics.jsonl" "$BATCH" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
timed = [r for r in rows if r["step"] > 10]
tokens = int(sys.argv[2]) * 1024
print(f'{tokens * len(timed) / sum(tokens / r["tokens_per_s"] for r in timed):.0f} {rows[-1]["loss"]:.4f}')
PY
)
        printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$place" "$prec" "$round" "$tps" | tee -a "$RES"
      done
    done
  done
done
echo
echo "| binary | optimizer | precision | round | tokens/s | loss at step $STEPS |"
echo "|---|---|---|---:|---:|---:|"
awk -F'\t' '{ split($5, a, " "); printf "| %s | %s | %s | %s | %s | %s |\n", $1, $2, $3, $4, a[1], a[2] }' "$RES"
rm -rf "${TMPDIR:-/tmp}/zt_bench_placement"

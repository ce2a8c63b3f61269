#!/usr/bin/env bash
# BERT-Large (bench/bert-large-cls.json: 24 x 1024, 16 heads, sequence 512) fine-tuning for classification on
# one GPU under a memory cap, ztrain against Hugging Face PyTorch, in one go:
#   bench/bert_gpu.sh [OUT_DIR]     (CAPS="11 32" GiB; CKPT="all none", ztrain's --checkpointing modes;
#                                    HF_BATCHES="79 319", the batches PyTorch runs at each cap, with gradient
#                                    checkpointing; SKIP_TORCH=1; BATCHES="107 483": ztrain's micro-batch per
#                                    cap, instead of searching for the largest)
# ztrain, per cap and checkpointing mode: the largest micro-batch that its planner fits under --gpu-mem
# (binary search over 1..1024, one step each), then 8 steps at that batch (steps 4-8 timed), bf16. PyTorch:
# bench/torch_bert.py at the given batches with gradient checkpointing under
# torch.cuda.set_per_process_memory_fraction. Prints a table of batches and examples/s; writes the logs and
# OUT_DIR/bench.jsonl. Needs the ztrain binary (ZTRAIN, default build/worker/ztrain), python3 with torch and
# transformers.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
RESULT_DIR="${1:-bench-out}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
CAPS="${CAPS:-11 32}"
CKPT="${CKPT:-all none}"
HF_BATCHES="${HF_BATCHES:-79 319}"
SKIP_TORCH="${SKIP_TORCH:-0}"
read -r -a FIXED <<< "${BATCHES:-}"
CFG="$HERE/bert-large-cls.json"
mkdir -p "$RESULT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_cls"
[ -f "$DATA/train.jsonl" ] || "$PY" "$HERE/make_cls_data.py" "$DATA" 1024 600
RES="$RESULT_DIR/bench.jsonl"
: > "$RES"

# run CAP B STEPS LOG: one ztrain run with checkpointing $mode; exit status 0 when it trained.
run() {
  local run="${TMPDIR:-/tmp}/zt_bench_bert_run"
  rm -rf "$run"
  "$ZTRAIN" train --model "$CFG" --train-data "$DATA/train.jsonl" --tokenizer "$DATA/tokenizer.json" --device cuda \
    --precision bf16 --gpu-mem "$1GiB" --checkpointing "$mode" --batch-size "$2" --seq-len 512 --steps "$3" \
    --save-every -1 --log-every 1 --out "$run" > "$4" 2>&1
}

ci=0
for cap in $CAPS; do
  for mode in $CKPT; do
    if [ -n "${FIXED[$ci]:-}" ]; then
      lo=${FIXED[$ci]}
      echo "ztrain: micro-batch $lo under ${cap} GiB with --checkpointing $mode (BATCHES)"
    else
      lo=0 hi=1025
      while [ $((hi - lo)) -gt 1 ]; do
        mid=$(((lo + hi) / 2))
        if run "$cap" "$mid" 1 "$RESULT_DIR/probe.log"; then lo=$mid; else hi=$mid; fi
      done
      echo "ztrain: largest micro-batch under ${cap} GiB with --checkpointing $mode: $lo"
    fi
    log="$RESULT_DIR/ztrain_${cap}g_$mode.log"
    run "$cap" "$lo" 8 "$log"
    "$PY" - "${TMPDIR:-/tmp}/zt_bench_bert_run/metrics.jsonl" "$log" "$lo" "$cap" "$mode" <<'PY' | tee -a "$RES"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
timed = [r for r in rows if 4 <= r["step"] <= 8]
B = int(sys.argv[3])
secs = sum(B * 512 / r["tokens_per_s"] for r in timed)
plan = re.search(r"plan: GPU ([0-9.]+ [MG]iB)", open(sys.argv[2]).read())
print(json.dumps({"impl": "ztrain", "cap_gib": float(sys.argv[4]), "batch": B, "checkpointing": sys.argv[5],
                  "examples_per_s": B * len(timed) / secs, "plan": plan.group(1) if plan else "?"}))
PY
    ci=$((ci + 1))
  done
done

if [ "$SKIP_TORCH" != 1 ]; then
  set -- $HF_BATCHES
  for cap in $CAPS; do
    b=$1; shift
    timeout "${TORCH_TIMEOUT:-300}" "$PY" "$HERE/torch_bert.py" --config "$CFG" --batch "$b" --cap-gib "$cap" \
      --checkpointing > "$RESULT_DIR/torch_${cap}g.log" 2>&1
    grep '^{' "$RESULT_DIR/torch_${cap}g.log" | tail -n 1 | tee -a "$RES"
  done
fi

"$PY" - "$RES" <<'PY' | tee "$RESULT_DIR/table.md"
import json, sys
print("| implementation | GPU memory cap | checkpointing | largest micro-batch | examples/s |")
print("|---|---:|---|---:|---:|")
for line in open(sys.argv[1]):
    d = json.loads(line)
    eps = "out of memory" if d.get("oom") else f"{d['examples_per_s']:.1f}"
    ck = d["checkpointing"]
    ck = ("every layer" if ck else "none") if isinstance(ck, bool) else {"all": "every layer"}.get(ck, ck)
    print(f"| {d['impl']} | {d['cap_gib']:g} GiB | {ck} | {d['batch']} | {eps} |")
PY

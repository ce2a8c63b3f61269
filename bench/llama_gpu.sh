#!/usr/bin/env bash
# A TinyLlama-shaped LLaMA (1.1B: 22 layers x 2048, 32 heads, 4 key/value heads, MLP 5632, vocabulary 32000;
# bench/tinyllama-1.1b.json) on one GPU, batch 8 x 2048, bf16: ztrain against PyTorch (Hugging Face
# LlamaForCausalLM, SDPA, fused AdamW; eager and torch.compile), in one go:
#   bench/llama_gpu.sh [OUT_DIR]      (TORCH_MODES="eager compile", SKIP_TORCH=1, BATCH=8 narrow it)
# Needs: the ztrain binary (ZTRAIN, default build/worker/ztrain), python3 with torch + transformers for the
# baseline, numpy for the random token shards. Writes OUT_DIR/bench.jsonl (one line per run) and the logs,
# and prints a table: tokens/s, TFLOP/s, MFU (6N + 6 L T C FLOPs per token against PEAK_TFLOPS, default
# 989 = H100/H200 dense bf16) and peak memory. ztrain trains 16 steps (steps 6-15 timed) and is stopped
# then, before its final checkpoint; PyTorch runs 5 warmup and 10 timed steps.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
RESULT_DIR="${1:-bench-out}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
SKIP_TORCH="${SKIP_TORCH:-0}"
TORCH_MODES="${TORCH_MODES:-eager compile}"
BATCH="${BATCH:-8}"
T=2048
CFG="$HERE/tinyllama-1.1b.json"
mkdir -p "$RESULT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_llama_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd" 8000000 32000
RES="$RESULT_DIR/bench.jsonl"
: > "$RES"

tag() { "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); d['batch']=$BATCH; print(json.dumps(d))"; }

run="${TMPDIR:-/tmp}/zt_bench_llama_run"
rm -rf "$run"
"$ZTRAIN" train --model "$CFG" --train-data "$DATA/rnd_train_000.bin" --device cuda --precision bf16 \
  --steps 16 --batch-size "$BATCH" --seq-len $T --out "$run" --save-every 0 --log-every 1 \
  > "$RESULT_DIR/ztrain_llama.log" 2>&1 &
pid=$!
# The final checkpoint of a 1.1B model is 13 GiB of fp32 state: stop once step 15 is logged instead.
while kill -0 $pid 2>/dev/null; do
  if [ -f "$run/metrics.jsonl" ] && grep -q '"step": *15[,}]' "$run/metrics.jsonl"; then sleep 1; kill $pid; break; fi
  sleep 0.5
done
wait $pid 2>/dev/null
"$PY" - "$run/metrics.jsonl" "$RESULT_DIR/ztrain_llama.log" "$BATCH" <<'PY' | tag | tee -a "$RES"
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tokens = int(sys.argv[3]) * 2048
timed = [r for r in rows if 6 <= r["step"] <= 15]
secs = sum(tokens / r["tokens_per_s"] for r in timed)
log = open(sys.argv[2]).read()
m = re.search(r"memory plan ([0-9.]+) (MiB|GiB)", log) or re.search(r"plan: GPU ([0-9.]+) (MiB|GiB)", log)
mem = float(m.group(1)) / (1024 if m.group(2) == "MiB" else 1) if m else float("nan")
p = re.search(r"([0-9.]+)M parameters", log)
print(json.dumps({"impl": "ztrain", "params": float(p.group(1)) * 1e6 if p else float("nan"),
                  "tokens_per_s": tokens * len(timed) / secs, "peak_mem_gib": mem, "loss": rows[-1]["loss"]}))
PY

if [ "$SKIP_TORCH" != 1 ]; then
  for mode in $TORCH_MODES; do
    timeout "${TORCH_TIMEOUT:-420}" "$PY" "$HERE/torch_llama.py" --config "$CFG" --batch "$BATCH" --seq $T \
      --mode "$mode" > "$RESULT_DIR/torch_llama_$mode.log" 2>&1
    grep '^{' "$RESULT_DIR/torch_llama_$mode.log" | tail -n 1 | tag | tee -a "$RES"
  done
fi

"$PY" - "$RES" "${PEAK_TFLOPS:-989}" <<'PY' | tee "$RESULT_DIR/table.md"
import json, sys
peak = float(sys.argv[2])
L, C, T = 22, 2048, 2048
print("| model | batch x T | implementation | tokens/s | TFLOP/s | MFU | peak memory (GiB) |")
print("|---|---|---|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    d = json.loads(line)
    flops = 6 * d["params"] + 6 * L * T * C
    tf = d["tokens_per_s"] * flops / 1e12
    print(f"| TinyLlama 1.1B | {d['batch']} x {T} | {d['impl']} | {d['tokens_per_s']:,.0f} | {tf:.1f} | "
          f"{100 * tf / peak:.1f}% | {d['peak_mem_gib']:.1f} |")
PY

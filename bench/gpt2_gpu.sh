#!/usr/bin/env bash
# GPT-2 124M and 1558M on one GPU, ztrain against PyTorch (eager and torch.compile), in one go:
#   bench/gpt2_gpu.sh [OUT_DIR]      (MODELS="124m 1558m", TORCH_MODES="eager compile", SKIP_TORCH=1 narrow it)
# ztrain runs once as it is (each GEMM form's algorithm tuned at its first call) and once with
# ZT_GEMM_TUNE=0 (cuBLASLt's heuristic first everywhere); ZTRAIN_TUNE="1" or "0" keeps one of the two.
# Needs: the ztrain binary (ZTRAIN, default build/worker/ztrain), python3 with torch + transformers for the
# baseline, numpy for the random token shards. Writes OUT_DIR/bench.jsonl (one line per run), the logs,
# and prints a table: tokens/s, TFLOP/s, MFU (6N + 6 L T C FLOPs per token against PEAK_TFLOPS, default
# 989 = H100/H200 dense bf16) and peak memory. ztrain runs 20 steps: steps 6-15 are timed, 16-20 run
# with per-kernel-family CUDA event timings (ZT_GPU_PROFILE), logged into OUT_DIR/ztrain_*.log.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
RESULT_DIR="${1:-bench-out}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
SKIP_TORCH="${SKIP_TORCH:-0}"
MODELS="${MODELS:-124m 1558m}"             # which of the two models to run
TORCH_MODES="${TORCH_MODES:-eager compile}" # which PyTorch baselines to run
ZTRAIN_TUNE="${ZTRAIN_TUNE:-1 0}"            # ztrain with / without GEMM tuning
mkdir -p "$RESULT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd" 4000000
RES="$RESULT_DIR/bench.jsonl"
: > "$RES"

tag() { "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); d['model']='$1'; d['batch']=$2; print(json.dumps(d))"; }

# ztrain NAME CONFIG B LABEL TUNE: trains 20 steps, records tok/s of steps 6..15 and the memory plan.
run_ztrain() {
  local name=$1 model=$2 batch=$3 label=$4 tune=$5 run="${TMPDIR:-/tmp}/zt_bench_run_$1"
  local impl=ztrain
  if [ "$tune" = 0 ]; then name="${name}_notune"; impl="ztrain, ZT_GEMM_TUNE=0"; fi
  rm -rf "$run"
  ZT_GEMM_TUNE=$tune ZT_GPU_PROFILE=16 "$ZTRAIN" train --model "$model" --train-data "$DATA/rnd_train_000.bin" --device cuda \
    --precision bf16 --steps 20 --batch-size "$batch" --seq-len 1024 --out "$run" --save-every 0 \
    --log-every 5 > "$RESULT_DIR/ztrain_$name.log" 2>&1 &
  local pid=$!
  # The final checkpoint of a 1558M model is 18 GiB: stop once the profile is logged instead.
  while kill -0 $pid 2>/dev/null; do
    if grep -q "profile: total" "$RESULT_DIR/ztrain_$name.log"; then kill $pid; break; fi
    sleep 0.5
  done
  wait $pid 2>/dev/null
  local line
  line=$("$PY" - "$run/metrics.jsonl" "$RESULT_DIR/ztrain_$name.log" "$batch" "$impl" <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tokens = int(sys.argv[3]) * 1024
timed = [r for r in rows if 6 <= r["step"] <= 15]
secs = sum(tokens / r["tokens_per_s"] for r in timed)
log = open(sys.argv[2]).read()
m = re.search(r"memory plan ([0-9.]+) (MiB|GiB)", log)
mem = float(m.group(1)) / (1024 if m.group(2) == "MiB" else 1) if m else float("nan")
p = re.search(r"([0-9.]+)M parameters", log)
print(json.dumps({"impl": sys.argv[4], "params": float(p.group(1)) * 1e6, "tokens_per_s": tokens * len(timed) / secs,
                  "peak_mem_gib": mem, "loss": rows[-1]["loss"]}))
PY
  ) && echo "$line" | tag "$label" "$batch" | tee -a "$RES"
}

# torch NAME MODE LABEL BATCH ARGS...: the PyTorch baseline, 5 warmup + 10 timed steps.
run_torch() {
  local name=$1 mode=$2 label=$3 batch=$4
  shift 4
  timeout "${TORCH_TIMEOUT:-420}" "$PY" "$HERE/torch_gpt2.py" "$@" --batch "$batch" --mode "$mode" --warmup 5 \
    --steps 10 > "$RESULT_DIR/torch_${name}_$mode.log" 2>&1
  grep '^{' "$RESULT_DIR/torch_${name}_$mode.log" | tail -n 1 | tag "$label" "$batch" | tee -a "$RES"
}

for model in $MODELS; do
  case $model in
    124m) cfg="$HERE/gpt2-124m.json"; batch=16; label=124M; shape="--layers 12 --heads 12 --embd 768" ;;
    1558m) cfg="$HERE/gpt2-1558m.json"; batch=8; label=1558M; shape="--layers 48 --heads 25 --embd 1600" ;;
    *) echo "unknown model '$model' in MODELS (use 124m and/or 1558m)" >&2; exit 2 ;;
  esac
  for tune in $ZTRAIN_TUNE; do
    run_ztrain "$model" "$cfg" "$batch" "$label" "$tune"
  done
  if [ "$SKIP_TORCH" != 1 ]; then
    for mode in $TORCH_MODES; do
      run_torch "$model" "$mode" "$label" "$batch" $shape
    done
  fi
done

"$PY" - "$RES" "${PEAK_TFLOPS:-989}" <<'PY' | tee "$RESULT_DIR/table.md"
import json, sys
peak = float(sys.argv[2])
shape = {"124M": (12, 768), "1558M": (48, 1600)}
print("| model | batch x T | implementation | tokens/s | TFLOP/s | MFU | peak memory (GiB) |")
print("|---|---|---|---:|---:|---:|---:|")
for line in open(sys.argv[1]):
    d = json.loads(line)
    L, C = shape[d["model"]]
    flops = 6 * d["params"] + 6 * L * 1024 * C
    tf = d["tokens_per_s"] * flops / 1e12
    print(f"| {d['model']} | {d['batch']} x 1024 | {d['impl']} | {d['tokens_per_s']:,.0f} | {tf:.1f} | "
          f"{100 * tf / peak:.1f}% | {d['peak_mem_gib']:.1f} |")
PY

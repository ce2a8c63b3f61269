#!/usr/bin/env bash
# The training engine on one GPU: speed and memory of the optimizer placements, side by side with a build
# from before the engine, in one go:
#   bench/engine/run.sh [OUT_DIR]
#   ZTRAIN=build/worker/ztrain      the build measured
#   ZTRAIN_OLD=path/to/ztrain       a build of main from before the change, run on the same rows (optional)
#   ROWS="..."                      which rows of the table below to run (default: all)
# Each row trains GPT-2 (bench/gpt2-124m.json or gpt2-1558m.json) in bf16 on random tokens, T = 1024, for
# STEPS steps (default 12; the first 3 are not timed) and stops before the final checkpoint. Reported:
# tokens/s (the timed steps), TFLOP/s and MFU (6N + 6 L T C FLOPs per token against PEAK_TFLOPS, default
# 989), the peak GPU memory the driver reports (sampled every 0.2 s, minus the memory in use before), and
# for the optimizer off the GPU the engine's breakdown of the last step (host AdamW, waits, bytes copied).
# Writes OUT_DIR/rows.jsonl, one log per row, and prints a table (OUT_DIR/table.md).
set -u
HERE="$(cd "$(dirname "$0")/.." && pwd)"
OUT_DIR="${1:-bench-out/engine}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
ZTRAIN_OLD="${ZTRAIN_OLD:-}"
PY="${PYTHON:-python3}"
STEPS="${STEPS:-12}"
mkdir -p "$OUT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd" 4000000 || exit 1
RES="$OUT_DIR/rows.jsonl"
: > "$RES"

# name | model | batch | grad_accum | optimizer | checkpointing | share of the optimizer kept on the GPU
# (--optimizer-gpu-fraction; "-" for none: then the row also runs on ZTRAIN_OLD)
TABLE="
124m_gpu          124m   16 1 gpu none -
1558m_gpu         1558m  8  1 gpu none -
1558m_cpu_ga1     1558m  8  1 cpu none -
1558m_cpu_ga4     1558m  8  4 cpu none -
1558m_cpu_ga8     1558m  8  8 cpu none -
1558m_cpu_ga1_f35 1558m  8  1 cpu none 0.35
1558m_cpu_ga4_f35 1558m  8  4 cpu none 0.35
1558m_cpu_ga8_f35 1558m  8  8 cpu none 0.35
1558m_gpu_ckpt    1558m  8  1 gpu all  -
1558m_cpu_ckpt    1558m  8  4 cpu all  -
"
ROWS="${ROWS:-$(echo "$TABLE" | awk 'NF {print $1}')}"

baseline_mib=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
baseline_mib=${baseline_mib:-0}

# run BUILD_LABEL BINARY NAME MODEL BATCH ACCUM OPTIMIZER CKPT FRACTION
run() {
  local label=$1 bin=$2 name=$3 model=$4 batch=$5 accum=$6 opt=$7 ckpt=$8 frac=$9
  local run="${TMPDIR:-/tmp}/zt_engine_run" log="$OUT_DIR/${name}_${label}.log" env=() extra=()
  [ "$frac" != - ] && extra=(--optimizer-gpu-fraction "$frac")
  # before the engine, activation checkpointing was on the ZeRO runtime only, chosen from the environment
  if [ "$label" = old ] && [ "$ckpt" != none ]; then env=(ZT_ZERO_LEVEL=3); fi
  rm -rf "$run"
  env "${env[@]}" "$bin" train --model "$HERE/gpt2-$model.json" --train-data "$DATA/rnd_train_000.bin" \
    --device cuda --precision bf16 --steps $((STEPS + 1)) --batch-size "$batch" --grad-accum "$accum" \
    --seq-len 1024 --optimizer "$opt" --checkpointing "$ckpt" "${extra[@]}" --save-every 0 --log-every 1 --out "$run" \
    > "$log" 2>&1 &
  local pid=$! peak=0
  # the final checkpoint of 1558M is 18 GiB: stop once the last timed step is in metrics.jsonl
  while kill -0 $pid 2>/dev/null; do
    local used
    used=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits 2>/dev/null | head -1)
    [ -n "$used" ] && [ "$used" -gt "$peak" ] && peak=$used
    if [ -f "$run/metrics.jsonl" ] && grep -q "\"step\":$STEPS," "$run/metrics.jsonl"; then kill -9 $pid; break; fi
    sleep 0.2
  done
  wait $pid 2>/dev/null
  "$PY" - "$run/metrics.jsonl" "$log" "$batch" "$accum" "$label" "$name" "$model" "$opt" "$ckpt" \
    "$((peak - baseline_mib))" "$STEPS" "$frac" <<'PY' | tee -a "$RES"
import json, re, sys
metrics, log, batch, accum, label, name, model, opt, ckpt, peak, steps, frac = sys.argv[1:]
try:
    rows = [json.loads(l) for l in open(metrics) if '"loss"' in l]
except OSError:
    rows = []
tokens = int(batch) * int(accum) * 1024
timed = [r for r in rows if 4 <= r["step"] <= int(steps)]
text = open(log).read()
out = {"name": name, "build": label, "model": model, "batch": int(batch), "grad_accum": int(accum),
       "optimizer": opt, "checkpointing": ckpt, "peak_gib": int(peak) / 1024, "steps": len(timed),
       "gpu_fraction": 0.0 if frac == "-" else float(frac)}
if timed:
    out["tokens_per_s"] = tokens * len(timed) / sum(tokens / r["tokens_per_s"] for r in timed)
    out["loss"] = rows[-1]["loss"]
else:
    out["error"] = (re.findall(r"(?:ERROR|error).*", text) or ["no steps"])[-1][:300]
m = re.findall(r"engine: step ([0-9.]+) s \| host update ([0-9.]+) s .*?blocks ([0-9.]+) s \| waited for the "
               r"backward and norm ([0-9.]+) s \| copied down ([0-9.]+ \w+), up ([0-9.]+ \w+)", text)
if m:
    s, h, wu, wn, down, up = m[-1]
    out.update(step_s=float(s), host_update_s=float(h), wait_update_s=float(wu), wait_norm_s=float(wn),
               down=down, up=up)
p = re.search(r"([0-9.]+)M parameters", text)
out["params"] = float(p.group(1)) * 1e6 if p else 0
print(json.dumps(out))
PY
}

for name in $ROWS; do
  row=$(echo "$TABLE" | awk -v n="$name" '$1 == n')
  [ -n "$row" ] || { echo "unknown row '$name' (see TABLE in $0)" >&2; exit 2; }
  set -- $row
  run new "$ZTRAIN" "$@"
  # the build before the engine had no split of the optimizer, and no checkpointing with it off the GPU
  if [ -n "$ZTRAIN_OLD" ] && [ "$7" = - ] && { [ "$5" = gpu ] || [ "$6" = none ]; }; then
    run old "$ZTRAIN_OLD" "$@"
  fi
done

"$PY" - "$RES" "${PEAK_TFLOPS:-989}" <<'PY' | tee "$OUT_DIR/table.md"
import json, sys
peak = float(sys.argv[2])
shape = {"124m": (12, 768), "1558m": (48, 1600)}
rows = [json.loads(l) for l in open(sys.argv[1])]
gpu = {(r["model"], r["build"], r["checkpointing"]): r.get("tokens_per_s") for r in rows if r["optimizer"] == "gpu"}
print("| row | build | batch x T x grad_accum | optimizer | checkpointing | tokens/s | MFU | vs gpu | peak GPU GiB "
      "| host AdamW s | waited for updates s | waited for norm s | step s |")
print("|---|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
def opt_name(r):
    return r["optimizer"] + (f" ({100 * r['gpu_fraction']:.0f}% on the GPU)" if r.get("gpu_fraction") else "")
for r in rows:
    if "tokens_per_s" not in r:
        print(f"| {r['name']} | {r['build']} | | {opt_name(r)} | {r['checkpointing']} | failed: {r.get('error', '')} |")
        continue
    L, C = shape[r["model"]]
    tf = r["tokens_per_s"] * (6 * r["params"] + 6 * L * 1024 * C) / 1e12
    ref = gpu.get((r["model"], r["build"], "none"))
    vs = f"{100 * r['tokens_per_s'] / ref:.0f}%" if ref and r["optimizer"] != "gpu" else ""
    br = [f"{r[k]:.3f}" if k in r else "" for k in ("host_update_s", "wait_update_s", "wait_norm_s", "step_s")]
    print(f"| {r['name']} | {r['build']} | {r['batch']} x 1024 x {r['grad_accum']} | {opt_name(r)} | "
          f"{r['checkpointing']} | {r['tokens_per_s']:,.0f} | {100 * tf / peak:.1f}% | {vs} | {r['peak_gib']:.1f} | "
          + " | ".join(br) + " |")
PY

#!/usr/bin/env bash
# T5 on one GPU: the T5 v1.1-large shape (24 + 24 layers x 1024, d_ff 2816 gated GELU, 16 heads of 64,
# vocabulary 32128; bench/t5/t5-v1_1-large.json), batch 16, input 512 + target 128 tokens, bf16: ztrain
# against PyTorch (Hugging Face T5ForConditionalGeneration, fused AdamW; eager and torch.compile), in one go:
#   bench/t5/run.sh [OUT_DIR]     (TORCH_MODES="eager compile", SKIP_TORCH=1, SKIP_ZTRAIN=1, BATCH=16,
#                                  CONFIG=... (e.g. bench/t5/t5-v1_1-xl.json) narrow it;
#                                  ZTRAIN_FLAGS="--gpu-mem 11GiB ..." adds flags to ztrain's run, GRAD_ACCUM=N
#                                  micro-batches of BATCH per ztrain step)
# Needs: the ztrain binary (ZTRAIN, default build/worker/ztrain), python3 (with torch + transformers for the
# baseline). ztrain reads JSONL records {"input", "target"} of random bytes (examples/byte-tokenizer.json)
# longer than both lengths, so that every position is filled, as in the baseline's random ids. Reported:
# examples/s and tokens/s (input + target tokens), the peak memory (ztrain: its plan; PyTorch: the
# allocator's peak), the last loss. ztrain trains 16 steps (6-15 timed) without checkpoints; PyTorch runs 5
# warmup and 10 timed steps. Writes OUT_DIR/bench.jsonl and OUT_DIR/table.md.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${1:-bench-out/t5}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
SKIP_TORCH="${SKIP_TORCH:-0}"
TORCH_MODES="${TORCH_MODES:-eager compile}"
BATCH="${BATCH:-16}"
CFG="${CONFIG:-$HERE/t5-v1_1-large.json}"
TIN=${INPUT_LEN:-512}
TOUT=${TARGET_LEN:-128}
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
RES="$OUT_DIR/bench.jsonl"
: > "$RES"
"$PY" - "$OUT_DIR/train.jsonl" <<'PY'
import json, random, sys
rng = random.Random(3)
letters = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,;:!?"
with open(sys.argv[1], "w") as f:
    for _ in range(4096):
        f.write(json.dumps({"input": "".join(rng.choice(letters) for _ in range(600)),
                            "target": "".join(rng.choice(letters) for _ in range(200))}) + "\n")
PY
tag() { "$PY" -c "import json,sys; d=json.loads(sys.stdin.read()); d['batch']=$BATCH; print(json.dumps(d))"; }

run="$OUT_DIR/ztrain-run"
if [ "${SKIP_ZTRAIN:-0}" != 1 ]; then
rm -rf "$run"
# shellcheck disable=SC2086
"$ZTRAIN" train --model "$CFG" --tokenizer "$ROOT/examples/byte-tokenizer.json" --sft-data "$OUT_DIR/train.jsonl" \
  --seq-len $TIN --target-len $TOUT --device "${DEVICE:-cuda}" ${PRECISION_FLAGS---precision bf16} --steps 16 --batch-size "$BATCH" \
  --grad-accum "${GRAD_ACCUM:-1}" --out "$run" --save-every -1 --log-every 1 ${ZTRAIN_FLAGS:-} > "$OUT_DIR/ztrain.log" 2>&1
"$PY" - "$run/metrics.jsonl" "$OUT_DIR/ztrain.log" "$BATCH" $TIN $TOUT "${GRAD_ACCUM:-1}" <<'PY' | tag | tee -a "$RES"
import json, re, sys
path, logp, b, tin, tout, ga = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6])
try:
    rows = [json.loads(l) for l in open(path) if '"loss"' in l]
except OSError:
    rows = []
timed = [r for r in rows if 6 <= r["step"] <= 15]
log = open(logp).read()
if not timed:
    print(json.dumps({"impl": "ztrain (failed: see ztrain.log)", "params": float("nan"), "examples_per_s": 0,
                      "tokens_per_s": 0, "peak_mem_gib": float("nan"), "loss": float("nan")}))
    sys.exit(0)
# metrics count the encoder's tokens (batch x seq_len) per step: the step's time from them
secs = sum(b * ga * tin / r["tokens_per_s"] for r in timed)
ex = b * ga * len(timed) / secs
m = re.search(r"memory plan ([0-9.]+) (MiB|GiB)", log) or re.search(r"plan: GPU ([0-9.]+) (MiB|GiB)", log)
mem = float(m.group(1)) / (1024 if m.group(2) == "MiB" else 1) if m else float("nan")
p = re.search(r"([0-9.]+)M parameters", log)
print(json.dumps({"impl": "ztrain", "params": float(p.group(1)) * 1e6 if p else float("nan"),
                  "examples_per_s": ex, "tokens_per_s": ex * (tin + tout), "peak_mem_gib": mem,
                  "loss": rows[-1]["loss"]}))
PY
fi

if [ "$SKIP_TORCH" != 1 ]; then
  for mode in $TORCH_MODES; do
    timeout "${TORCH_TIMEOUT:-420}" "$PY" "$HERE/torch_t5.py" --config "$CFG" --batch "$BATCH" --input-len $TIN \
      --target-len $TOUT --mode "$mode" > "$OUT_DIR/torch_t5_$mode.log" 2>&1
    grep '^{' "$OUT_DIR/torch_t5_$mode.log" | tail -n 1 | tag | tee -a "$RES"
  done
fi

"$PY" - "$RES" <<'PY' | tee "$OUT_DIR/table.md"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
best = max([r["tokens_per_s"] for r in rows if r["impl"].startswith("PyTorch")] or [0])
print("| model | batch | implementation | examples/s | tokens/s | vs faster PyTorch | peak memory (GiB) | last loss |")
print("|---|---:|---|---:|---:|---:|---:|---:|")
for d in rows:
    ratio = f"{d['tokens_per_s'] / best:.2f}x" if best else "-"
    print(f"| T5 {d['params'] / 1e6:.0f}M | {d['batch']} | {d['impl']} | {d['examples_per_s']:.1f} | "
          f"{d['tokens_per_s']:,.0f} | {ratio} | {d['peak_mem_gib']:.1f} | {d['loss']:.4f} |")
PY

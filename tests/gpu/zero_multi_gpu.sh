#!/usr/bin/env bash
# The training engine on two GPUs (W = 2, NCCL) against one (W = 1), through `ztrain launch`:
#   tests/gpu/zero_multi_gpu.sh [ZTRAIN]        (default build/worker/ztrain; ctest passes its own)
# Trains a 4-layer GPT-2 for 20 steps in fp32 from the same seed and data: W = 1, W = 2 at ZeRO-3 with
# prefetch 2, W = 2 with the optimizer on the host, and W = 2 at ZeRO-2 with activation checkpointing every:2 and grad_accum 2
# over half batches; the losses of metrics.jsonl must agree within 1e-4 relative (the sums over ranks
# are added in another order, nothing else differs). Then W = 2 resumes from the W = 1 checkpoint of
# step 10 and must follow the W = 1 run. Exits 77 (skipped) with fewer than two GPUs.
# DEVICE=cpu runs the same comparison on the CPU (a check of the script itself).
set -u
ZTRAIN="${1:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cuda}"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
if [ "$DEVICE" = cuda ] && [ "${gpus:-0}" -lt 2 ]; then
  echo "fewer than two GPUs visible (${gpus:-0}): skipped"
  exit 77
fi
precision=(--precision fp32)
[ "$DEVICE" = cuda ] || precision=()
dir=$(mktemp -d "${TMPDIR:-/tmp}/zt_zero_multi_gpu_XXXXXX")
trap 'rm -rf "$dir"' EXIT

# Token shards (llm.c format: 256 int32 header, then uint16 tokens) and the model.
"$PY" - "$dir" <<'PY'
import struct, sys
d = sys.argv[1]
for name, n, seed in (("t_train_000.bin", 60000, 7), ("t_val_000.bin", 6000, 9)):
    x, toks = seed, []
    for i in range(n):
        x = (x * 1664525 + 1013904223) & 0xffffffff
        toks.append((x >> 16) % 200 if i % 4 == 3 else ((i % 13) * 17 + 3) % 200)
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
        f.write(struct.pack(f"<{n}H", *toks))
PY
cat > "$dir/model.json" <<'JSON'
{"model_type": "gpt2", "n_layer": 4, "n_head": 2, "n_embd": 128, "n_positions": 64, "vocab_size": 200}
JSON
common=(--model "$dir/model.json" --train-data "$dir/t_train_*.bin" --val-data "$dir/t_val_*.bin" --steps 20
        --seq-len 64 --device "$DEVICE" "${precision[@]}" --lr 2e-3 --min-lr 2e-4 --warmup 3 --eval-every 10
        --eval-batches 2 --save-every 10 --log-every 5 --seed 11)

fail=0
run() { # NAME ENV... -- ARGS...: one run, its log in $dir/NAME.log
  local name=$1; shift
  if ! env "$@" > "$dir/$name.log" 2>&1; then
    echo "FAIL: run $name failed; its log:"; tail -30 "$dir/$name.log"; fail=1
  fi
}
run w1 "$ZTRAIN" train "${common[@]}" --batch-size 4 --out "$dir/w1"
run w2 "$ZTRAIN" launch --nproc 2 train "${common[@]}" --batch-size 4 --prefetch 2 --out "$dir/w2"
run w2h "$ZTRAIN" launch --nproc 2 train "${common[@]}" --batch-size 4 --optimizer cpu --out "$dir/w2h"
# unshuffled data: grad_accum 2 over batches of 2 must see the tokens of batches of 4, so both are unshuffled
cat > "$dir/noshuffle.json" <<'JSON'
{"shuffle": false}
JSON
run w1n "$ZTRAIN" train --config "$dir/noshuffle.json" "${common[@]}" --batch-size 4 --out "$dir/w1n"
run w2b "$ZTRAIN" launch --nproc 2 train --config "$dir/noshuffle.json" \
  "${common[@]}" --batch-size 2 --grad-accum 2 --zero-level 2 --checkpointing every:2 --out "$dir/w2b"
# W = 1's checkpoint of step 10, continued at W = 2
cp -r "$dir/w1" "$dir/w2r" && rm -rf "$dir/w2r/ckpt_000020"
run w2r "$ZTRAIN" launch --nproc 2 train "${common[@]}" --batch-size 4 --out "$dir/w2r" --resume "$dir/w2r/ckpt_000010"
[ "$fail" = 0 ] || exit 1

"$PY" - "$dir" <<'PY'
import json, sys
d = sys.argv[1]
def losses(name):
    return {r["step"]: r["loss"] for r in map(json.loads, open(f"{d}/{name}/metrics.jsonl")) if "loss" in r}
ok = True
for ref, other, what in (("w1", "w2", "W=2 ZeRO-3 prefetch 2"), ("w1", "w2h", "W=2 optimizer on the host"),
                         ("w1n", "w2b", "W=2 ZeRO-2 every:2 grad_accum 2"),
                         ("w1", "w2r", "W=2 resumed from W=1's step 10")):
    a, b = losses(ref), losses(other)
    steps = sorted(set(a) & set(b))
    worst = max(abs(a[s] - b[s]) / abs(a[s]) for s in steps)
    good = len(steps) >= 10 and worst <= 1e-4
    ok &= good
    print(f"{'ok' if good else 'FAIL'}: {what} vs W=1: {len(steps)} steps, largest relative loss difference {worst:.3g}")
sys.exit(0 if ok else 1)
PY

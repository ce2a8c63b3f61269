#!/usr/bin/env bash
# Checks that a build gives the losses and weights of another build bit for bit on one GPU (the training
# engine against the single-GPU trainer it replaced):
#   bench/engine/same_bits.sh OLD_ZTRAIN NEW_ZTRAIN [OUT_DIR]
# Trains a 4-layer GPT-2 (2 heads of 64, T = 64, vocabulary 200) for 20 steps with the optimizer on the
# GPU in fp32, bf16 (grad_accum 1 and 2) and fp16 (dynamic loss scaling), and compares every step's loss in
# metrics.jsonl and the final checkpoint's model.safetensors byte for byte. Prints one line per case and
# exits 1 if any differs.
set -u
OLD="$1"
NEW="$2"
OUT_DIR="${3:-bench-out/same_bits}"
PY="${PYTHON:-python3}"
mkdir -p "$OUT_DIR"
dir=$(mktemp -d "${TMPDIR:-/tmp}/zt_same_bits_XXXXXX")
trap 'rm -rf "$dir"' EXIT
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
        --seq-len 64 --device cuda --optimizer gpu --lr 2e-3 --min-lr 2e-4 --warmup 3 --eval-every 10
        --eval-batches 2 --save-every 10 --log-every 5 --seed 11)
fail=0
for c in "fp32 4 1" "bf16 4 1" "bf16 2 2" "fp16 4 1"; do
  set -- $c
  name="$1_ga$3"
  for b in old new; do
    bin=$OLD; [ $b = new ] && bin=$NEW
    if ! "$bin" train "${common[@]}" --precision "$1" --batch-size "$2" --grad-accum "$3" --out "$dir/${name}_$b" \
        > "$OUT_DIR/${name}_$b.log" 2>&1; then
      echo "FAIL $name: the $b build failed (see $OUT_DIR/${name}_$b.log)"; fail=1; continue 2
    fi
  done
  if "$PY" - "$dir/${name}_old" "$dir/${name}_new" "$name" <<'PY'
import json, sys
a, b, name = sys.argv[1:]
def losses(d):
    return [(r["step"], r.get("loss"), r.get("val_loss")) for r in map(json.loads, open(d + "/metrics.jsonl"))]
la, lb = losses(a), losses(b)
wa = open(a + "/ckpt_000020/model.safetensors", "rb").read()
wb = open(b + "/ckpt_000020/model.safetensors", "rb").read()
same = la == lb and wa == wb
diff = sum(x != y for x, y in zip(la, lb))
print(f"{'ok  ' if same else 'FAIL'} {name}: {len(la)} metrics lines, {diff} differ; final weights "
      f"{'identical' if wa == wb else 'differ'} ({len(wa)} bytes); loss {la[0][1]} -> {la[-2][1]}")
sys.exit(0 if same else 1)
PY
  then :; else fail=1; fi
done
exit $fail

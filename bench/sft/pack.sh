#!/usr/bin/env bash
# Packed against padded fine-tuning batches (--sft-pack): the same short chats (a few dozen tokens each) of a
# byte-level LLaMA, trained one epoch both ways with rows of SEQ_LEN tokens, on --device DEVICE:
#   bench/sft/pack.sh [OUT_DIR]      (DEVICE=cpu|cuda, SEQ_LEN=512, BATCH=8, CHATS=4000, PRECISION=bf16 on cuda,
#                                     HIDDEN=256, LAYERS=4: the model, or MODEL=config.json, e.g.
#                                     bench/tinyllama-1.1b.json; LENGTHS=MIN:MAX: chats of MIN to MAX bytes,
#                                     log-uniform, instead of the short ones; HF=1: also Hugging Face's
#                                     LlamaForCausalLM on the same chats, batches padded to their longest)
# Prints, for each way: the rows an epoch takes (the steps), the wall time of the epoch, the trained tokens a
# second, the rows' fill and the validation loss at the end (the same examples, so the losses should be close;
# the step count differs, so the learning-rate schedule does too). Needs the ztrain binary (ZTRAIN, default
# build/worker/ztrain) and python3. Writes OUT_DIR/{padded,packed}.log.
set -eu
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
OUT_DIR="${1:-bench-out/sft-pack}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
DEVICE="${DEVICE:-cpu}"
T="${SEQ_LEN:-512}"
B="${BATCH:-8}"
N="${CHATS:-4000}"
C="${HIDDEN:-256}"
L="${LAYERS:-4}"
mkdir -p "$OUT_DIR"
"$PY" - "$OUT_DIR" "$N" "${LENGTHS:-short}" <<'PY'
import json, math, random, sys
out, n, lengths = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rng = random.Random(7)
def words(nbytes):
    s = ""
    while len(s) < nbytes:
        s += "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randrange(2, 9))) + " "
    return s[:nbytes].strip() or "a"
def long_chat(lo, hi):
    # the rendered chat (ChatML adds about 60 bytes) of lo to hi bytes, log-uniform; the answer 60% of it
    total = int(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    body = max(2, total - 60)
    q = words(max(1, body * 2 // 5))
    return {"messages": [{"role": "user", "content": q},
                         {"role": "assistant", "content": words(max(1, body - len(q)))}]}
def chat():
    if lengths != "short":
        lo, hi = (int(v) for v in lengths.split(":"))
        return long_chat(lo, hi)
    a, b = rng.randrange(100), rng.randrange(100)
    kind = rng.randrange(3)
    if kind == 0:
        q, r = f"{a}+{b}?", f"{a + b}"
    elif kind == 1:
        w = "".join(rng.choice("abcdefgh") for _ in range(rng.randrange(3, 12)))
        q, r = f"Reverse {w}.", w[::-1]
    else:
        q, r = f"Repeat {a} three times.", f"{a} {a} {a}"
    return {"messages": [{"role": "user", "content": q}, {"role": "assistant", "content": r}]}
for name, count in (("train", n), ("val", max(64, n // 20))):
    with open(f"{out}/{name}.jsonl", "w") as f:
        for _ in range(count):
            f.write(json.dumps(chat()) + "\n")
PY
if [ -n "${MODEL:-}" ]; then cp "$MODEL" "$OUT_DIR/model.json"; else cat > "$OUT_DIR/model.json" <<J
{"model_type": "llama", "hidden_size": $C, "intermediate_size": $((C * 8 / 3 / 8 * 8)), "num_hidden_layers": $L,
 "num_attention_heads": $((C / 32)), "num_key_value_heads": $((C / 64)), "max_position_embeddings": $T, "vocab_size": 256,
 "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": false}
J
fi
prec=()
[ "$DEVICE" = cuda ] && prec=(--precision "${PRECISION:-bf16}")
for way in padded packed; do
  flags=()
  [ "$way" = packed ] && flags=(--sft-pack)
  # one epoch: as many steps as the loader has batches (read from a dry first line of the log)
  rows=$("$ZTRAIN" train --model "$OUT_DIR/model.json" --tokenizer "$ROOT/examples/byte-tokenizer.json" \
    --sft-data "$OUT_DIR/train.jsonl" --chat-template chatml --seq-len "$T" --batch-size "$B" --steps 1 \
    --save-every -1 --out "$OUT_DIR/probe-$way" --device "$DEVICE" "${prec[@]}" "${flags[@]}" 2>&1 |
    sed -n "s/.*; \([0-9]*\) batches of $B x $T per epoch.*/\1/p" | head -1)
  start=$(date +%s.%N)
  "$ZTRAIN" train --model "$OUT_DIR/model.json" --tokenizer "$ROOT/examples/byte-tokenizer.json" \
    --sft-data "$OUT_DIR/train.jsonl" --sft-val-data "$OUT_DIR/val.jsonl" --chat-template chatml --seq-len "$T" \
    --batch-size "$B" --steps "$rows" --lr 2e-3 --min-lr 2e-4 --warmup $((rows / 10)) --eval-every "$rows" --save-every -1 \
    --log-every 50 --out "$OUT_DIR/run-$way" --device "$DEVICE" "${prec[@]}" "${flags[@]}" > "$OUT_DIR/$way.log" 2>&1
  end=$(date +%s.%N)
  trained=$(sed -n "s/.* \([0-9]*\) trained (.*/\1/p" "$OUT_DIR/$way.log" | head -1)
  fill=$(sed -n "s/.*padding \([0-9.]*\)% of the rows' tokens.*/\1/p" "$OUT_DIR/$way.log" | head -1)
  val=$(sed -n "s/.*val loss [0-9.]* -> \([0-9.]*\).*/\1/p" "$OUT_DIR/$way.log" | tail -1)
  "$PY" -c "import sys; w,r,s,e,t,f,v=sys.argv[1:]; d=float(e)-float(s); print(f'{w:7s} {int(r):6d} steps of {$B} x {$T}  {d:8.1f} s  {int(t)/d:10.0f} trained tok/s  padding {f}%  val loss {v}')" \
    "$way" "$rows" "$start" "$end" "$trained" "$fill" "${val:-nan}"
done
if [ "${HF:-0}" = 1 ]; then
  "$PY" "$HERE/torch_sft.py" --config "$OUT_DIR/model.json" --data "$OUT_DIR/train.jsonl" --batch "$B" \
    --max-len "$T" --device "$DEVICE" > "$OUT_DIR/hf.log" 2>&1 || { echo "torch_sft.py failed: $OUT_DIR/hf.log"; exit 1; }
  tail -n 1 "$OUT_DIR/hf.log"
fi

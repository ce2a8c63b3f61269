#!/usr/bin/env bash
# Two builds of ztrain side by side on one GPU, alternating, on the shapes the model code must keep fast:
# GPT-2 124M (16 x 1024), GPT-2 1558M (8 x 1024) with and without every layer checkpointed, TinyLlama 1.1B
# (8 x 2048), and, when RUNS names them, the GPT-2-shaped 6.7B under --gpu-mem 11GiB (g67b: 14 x 1024,
# grad_accum 2, every layer checkpointed, host AdamW; 6 steps, 3-6 timed) and BERT-Large classification
# under --gpu-mem 11GiB (bert11: micro-batch 106 x 512, every layer checkpointed), all bf16. Prints a table of tokens/s (steps 6-15 of 16) per build and round, the GPU memory
# plan, and the largest relative difference between the two builds' losses at every step.
#   bench/families/gpu_ab.sh OLD_ZTRAIN NEW_ZTRAIN [OUT_DIR]     (ROUNDS=2, RUNS="g124 g1558 g1558ck tiny")
set -u
old=$1 new=$2 outdir=${3:-bench-out/ab}
HERE="$(cd "$(dirname "$0")/.." && pwd)"
PY=${PYTHON:-python3}
ROUNDS=${ROUNDS:-2}
RUNS=${RUNS:-"g124 g1558 g1558ck tiny"}
mkdir -p "$outdir"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd" 4000000
# TinyLlama's vocabulary of 32000: shards of its own
[ -f "$DATA/rnd32k_train_000.bin" ] || "$PY" "$HERE/make_shards.py" "$DATA/rnd32k" 8000000 32000

flags() {
  case $1 in
    g124) echo "--model $HERE/gpt2-124m.json --batch-size 16 --seq-len 1024" ;;
    g1558) echo "--model $HERE/gpt2-1558m.json --batch-size 8 --seq-len 1024" ;;
    g1558ck) echo "--model $HERE/gpt2-1558m.json --batch-size 8 --seq-len 1024 --checkpointing all" ;;
    tiny) echo "--model $HERE/tinyllama-1.1b.json --batch-size 8 --seq-len 2048" ;;
    g67b) echo "--model $HERE/gpt2-6.7b.json --batch-size 14 --grad-accum 2 --seq-len 1024 --gpu-mem 11GiB" \
            "--checkpointing all --optimizer cpu" ;;
    bert11) echo "--model $HERE/bert-large-cls.json --tokenizer $CLS/tokenizer.json --batch-size 106 --seq-len 512" \
            "--gpu-mem 11GiB --checkpointing all" ;;
  esac
}
steps() { case $1 in g67b) echo 6 ;; *) echo 16 ;; esac; }
case " $RUNS " in *" bert11 "*)
  CLS="${TMPDIR:-/tmp}/zt_bench_cls"
  [ -f "$CLS/train.jsonl" ] || "$PY" "$HERE/make_cls_data.py" "$CLS" 1024 600 ;;
esac

# run NAME BUILD ROUND: 16 steps, no checkpoint; writes the run's metrics and log.
run() {
  local bin=$old; [ "$2" = new ] && bin=$new
  local dir="$outdir/$1_$2_$3"
  rm -rf "$dir"
  # shellcheck disable=SC2046
  local data="$DATA/rnd_train_000.bin"; [ "$1" = tiny ] && data="$DATA/rnd32k_train_000.bin"
  [ "$1" = bert11 ] && data="$CLS/train.jsonl"
  "$bin" train $(flags "$1") --train-data "$data" --device cuda --precision bf16 --steps "$(steps "$1")" \
    --out "$dir" --save-every -1 --log-every 1 --seed 1 > "$dir.log" 2>&1 || echo "FAILED: $1 $2 (see $dir.log)"
}

for name in $RUNS; do
  for r in $(seq 1 "$ROUNDS"); do
    if [ $((r % 2)) = 1 ]; then run "$name" old "$r"; run "$name" new "$r"; else run "$name" new "$r"; run "$name" old "$r"; fi
  done
done

"$PY" - "$outdir" "$ROUNDS" $RUNS <<'PY'
import json, os, re, sys
out, rounds, runs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
def metrics(d):
    p = os.path.join(d, "metrics.jsonl")
    return [json.loads(l) for l in open(p) if '"loss"' in l] if os.path.exists(p) else []
def tok_s(rows):
    last = max((r["step"] for r in rows), default=0)
    first = 3 if last < 10 else 6  # the short runs (g67b) time steps 3..last, the others 6..15
    t = [r for r in rows if first <= r["step"] <= min(last, 15)]
    return sum(r["tokens_per_s"] for r in t) / len(t) if t else float("nan")
def plan(log):
    m = re.search(r"plan: GPU ([0-9.]+ [MG]iB)", open(log).read()) if os.path.exists(log) else None
    return m.group(1) if m else "?"
print(f"| run | old tokens/s (rounds) | new tokens/s (rounds) | new/old | plan old / new | max rel. loss diff |")
print("|---|---|---|---:|---|---:|")
for name in runs:
    o = [tok_s(metrics(f"{out}/{name}_old_{r}")) for r in range(1, rounds + 1)]
    n = [tok_s(metrics(f"{out}/{name}_new_{r}")) for r in range(1, rounds + 1)]
    lo, ln = metrics(f"{out}/{name}_old_1"), metrics(f"{out}/{name}_new_1")
    diff = max((abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in zip(lo, ln)), default=float("nan"))
    ratio = (sum(n) / len(n)) / (sum(o) / len(o))
    print(f"| {name} | {' / '.join(f'{x:,.0f}' for x in o)} | {' / '.join(f'{x:,.0f}' for x in n)} | {ratio:.4f} | "
          f"{plan(f'{out}/{name}_old_1.log')} / {plan(f'{out}/{name}_new_1.log')} | {diff:.2e} |")
    if lo:
        print(f"|   losses | old {lo[0]['loss']:.5f} .. {lo[-1]['loss']:.5f} | new {ln[0]['loss'] if ln else float('nan'):.5f} .. {ln[-1]['loss'] if ln else float('nan'):.5f} | | | |")
PY

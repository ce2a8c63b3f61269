#!/usr/bin/env bash
# How much of the ZeRO runtime's communication hides behind compute on GPUs, from CUDA events:
#   bench/zero/timeline.sh [OUT_DIR]
# Trains MODEL (default bench/gpt2-1558m.json) on NPROC GPUs (default 1; `ztrain launch` above 1) with
# ZT_ZERO_TIMELINE=1, BATCH sequences of 1024 tokens per rank (default 8), bf16, ZeRO level LEVEL (3) and
# prefetch PREFETCH (2), for STEPS steps (default 8; the first two are warm-up and not averaged). The runtime
# logs one line per step: the step's all-gather and reduce-scatter time, the part of it that overlapped a
# block's compute, and the hidden fraction. Then (SINGLE=1, the default, NPROC=1 only) the single-GPU
# trainer runs the same model and batch for the tokens/s to compare with. Prints a table; the logs and a
# summary.json land in OUT_DIR (default bench-out/zero). The runs are polled once a second, so a small
# model runs (and averages) more steps than STEPS. Needs the ztrain binary (ZTRAIN, default
# build/worker/ztrain) and python3 with numpy (random token shards). The runs are stopped once measured,
# so no checkpoint of the large model is written.
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
RESULT_DIR="${1:-bench-out/zero}"
ZTRAIN="${ZTRAIN:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
MODEL="${MODEL:-$HERE/../gpt2-1558m.json}"
NPROC="${NPROC:-1}"
BATCH="${BATCH:-8}"
STEPS="${STEPS:-8}"
LEVEL="${LEVEL:-3}"
PREFETCH="${PREFETCH:-2}"
SINGLE="${SINGLE:-1}"
mkdir -p "$RESULT_DIR"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$HERE/../make_shards.py" "$DATA/rnd" 4000000

# run NAME PATTERN COUNT CMD...: runs CMD in the background (its own process group) until its log holds
# COUNT lines matching PATTERN, then stops it and everything it started (SIGKILL: no final checkpoint).
run() {
  local name=$1 pattern=$2 count=$3
  shift 3
  local log="$RESULT_DIR/$name.log"
  setsid "$@" > "$log" 2>&1 &
  local pid=$!
  while kill -0 "$pid" 2>/dev/null; do
    [ "$(grep -c "$pattern" "$log")" -ge "$count" ] && break
    sleep 1
  done
  kill -9 -- -"$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  if [ "$(grep -c "$pattern" "$log")" -lt "$count" ]; then
    echo "$name ended before $count '$pattern' lines; the end of $log:"
    tail -20 "$log"
    return 1
  fi
}

common=(--model "$MODEL" --train-data "$DATA/rnd_train_000.bin" --device cuda --precision bf16 --steps 100000
        --batch-size $((BATCH * NPROC)) --seq-len 1024 --save-every 0 --eval-every 0 --log-every 1)
rm -rf "$RESULT_DIR/run_zero" "$RESULT_DIR/run_single"
if [ "$NPROC" -gt 1 ]; then
  run zero "zero timeline: step $STEPS |" 1 env ZT_ZERO_TIMELINE=1 ZT_ZERO_LEVEL="$LEVEL" ZT_PREFETCH="$PREFETCH" \
    "$ZTRAIN" launch --nproc "$NPROC" train "${common[@]}" --out "$RESULT_DIR/run_zero" || exit 1
else
  run zero "zero timeline: step $STEPS |" 1 env ZT_ZERO_TIMELINE=1 ZT_ZERO_LEVEL="$LEVEL" ZT_PREFETCH="$PREFETCH" \
    "$ZTRAIN" train "${common[@]}" --out "$RESULT_DIR/run_zero" || exit 1
fi
if [ "$SINGLE" = 1 ] && [ "$NPROC" = 1 ]; then
  run single "step $STEPS/100000 " 1 "$ZTRAIN" train "${common[@]}" --out "$RESULT_DIR/run_single" || true
fi

"$PY" - "$RESULT_DIR" "$STEPS" "$NPROC" "$LEVEL" "$PREFETCH" "$BATCH" <<'PY'
import json, os, re, sys
out, steps, nproc, level, prefetch, batch = sys.argv[1], int(sys.argv[2]), *map(int, sys.argv[3:])
rows = []  # [step, step ms, compute, all-gather, calls, reduce-scatter, calls, comm, hidden, rank]
for line in open(f"{out}/zero.log"):
    # `ztrain launch` puts "[rN] " after the time stamp and level of every rank's line.
    m = re.search(r"(?:\[r(\d+)\] )?zero timeline: step (\d+) \| step ([\d.]+) ms \| compute ([\d.]+) ms \| "
                  r"all-gather ([\d.]+) ms \((\d+)\) \| reduce-scatter ([\d.]+) ms \((\d+)\) \| comm ([\d.]+) ms, "
                  r"hidden ([\d.]+) ms", line)
    if m:
        g = m.groups()
        rows.append([float(x) for x in g[1:]] + [int(g[0] or 0)])
rows.sort(key=lambda r: (r[0], r[9]))
def tok_s(path):
    try:
        rs = [json.loads(l) for l in open(path) if '"loss"' in l]
    except OSError:
        return float("nan")
    rs = [r for r in rs if r["step"] > 2]
    return sum(r["tokens_per_s"] for r in rs) / len(rs) if rs else float("nan")
print(f"ZeRO-{level}, W={nproc}, prefetch {prefetch}, batch {batch} x 1024 per rank, bf16")
print(f"{'rank':>4} {'step':>4} {'step ms':>9} {'compute':>9} {'all-gather':>11} {'reduce-sc.':>11} {'comm':>9} {'hidden':>9} {'hidden %':>9}")
for r in rows:
    frac = 100 * r[8] / r[7] if r[7] > 0 else 100.0
    print(f"{r[9]:>4} {int(r[0]):>4} {r[1]:>9.1f} {r[2]:>9.1f} {r[3]:>8.1f}({int(r[4])}) {r[5]:>8.1f}({int(r[6])}) {r[7]:>9.1f} {r[8]:>9.1f} {frac:>8.1f}%")
timed = [r for r in rows if r[0] > 2]  # every rank's steps after the warm-up: the sums cover all ranks
comm, hidden = sum(r[7] for r in timed), sum(r[8] for r in timed)
steps_seen = len({int(r[0]) for r in timed})
summary = {"nproc": nproc, "level": level, "prefetch": prefetch, "batch_per_rank": batch, "steps_averaged": steps_seen,
           "comm_ms_per_step": comm / max(len(timed), 1), "hidden_ms_per_step": hidden / max(len(timed), 1),
           "worst_rank_hidden_fraction": min((sum(r[8] for r in timed if r[9] == k) /
                                              max(sum(r[7] for r in timed if r[9] == k), 1e-9)
                                              for k in {r[9] for r in timed}), default=1.0),
           "hidden_fraction": hidden / comm if comm > 0 else 1.0,
           "zero_tokens_per_s": tok_s(f"{out}/run_zero/metrics.jsonl"),
           "single_gpu_tokens_per_s": tok_s(f"{out}/run_single/metrics.jsonl")}
last = int(timed[-1][0]) if timed else 0
print(f"steps 3..{last}: comm {summary['comm_ms_per_step']:.1f} ms/step per rank, hidden {summary['hidden_ms_per_step']:.1f} "
      f"ms/step = {100 * summary['hidden_fraction']:.1f}% hidden (worst rank {100 * summary['worst_rank_hidden_fraction']:.1f}%)")
print(f"tokens/s: ZeRO {summary['zero_tokens_per_s']:.0f} ({summary['zero_tokens_per_s'] / nproc:.0f} per GPU), "
      f"single-GPU trainer {summary['single_gpu_tokens_per_s']:.0f}")
json.dump({k: (None if isinstance(v, float) and v != v else v) for k, v in summary.items()},
          open(f"{out}/summary.json", "w"), indent=1)  # NaN (a run not made) as null
PY

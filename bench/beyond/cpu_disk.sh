#!/usr/bin/env bash
# The host AdamW over state on disk on CPU ranks, before and after the reads ahead across the step boundary:
# a GPT-2 of 12 layers x 1536 over bytes (340.6M parameters) under --host-mem 7100MiB with bf16 moments and
# --moments-dir (the plan puts the moments and the fp32 masters of 11 of 14 blocks on disk: 2.32 GiB of
# records read and written per step), micro-batch 1 x SEQ tokens, GA micro-batches, STEPS steps, alternating
# ZT_MOMENTS_READ_AHEAD=0 ("cold": every update starts with a cold read) and the default ("ahead"), ROUNDS
# times. Small micro-batches make the update's disk chain the step's bound, as on the GPU at 7B.
#   bench/beyond/cpu_disk.sh [ZTRAIN] [WORK_DIR]     (env: SEQ=16 GA=1 STEPS=8 ROUNDS=2)
# Prints one line per run with the means over its steps 3..STEPS (the first has no update, the second's
# update starts cold either way) of the engine's breakdown: step, host update, the passes' wait for updated
# blocks, the update's disk read and write waits, and the records it found read ahead; then the peak RSS.
set -euo pipefail
ZTRAIN=${1:-build/worker/ztrain}
WORK=${2:-/tmp/zt_cpu_disk}
SEQ=${SEQ:-16} GA=${GA:-1} STEPS=${STEPS:-8} ROUNDS=${ROUNDS:-2}
mkdir -p "$WORK"
# random bytes in llm.c's shard format (Python's standard library only)
[ -f "$WORK/data_train_000.bin" ] || python3 - "$WORK/data_train_000.bin" <<'PY'
import random, struct, sys
random.seed(1234)
n = 200000
with open(sys.argv[1], "wb") as f:
    hdr = [0] * 256
    hdr[0], hdr[1], hdr[2] = 20240520, 1, n
    f.write(struct.pack("<256i", *hdr))
    f.write(struct.pack(f"<{n}H", *[random.randrange(256) for _ in range(n)]))
PY
cat > "$WORK/model.json" <<'JSON'
{"model_type": "gpt2", "n_layer": 12, "n_head": 16, "n_embd": 1536, "n_positions": 128, "vocab_size": 256,
 "tie_word_embeddings": true}
JSON
for round in $(seq 1 "$ROUNDS"); do
    for mode in cold ahead; do
        rm -rf "$WORK/state" "$WORK/run"
        mkdir -p "$WORK/state"
        ahead=1
        [ "$mode" = cold ] && ahead=0
        ZT_MOMENTS_READ_AHEAD=$ahead /usr/bin/time -f "%M" -o "$WORK/rss" "$ZTRAIN" train --model "$WORK/model.json" \
            --train-data "$WORK/data_train_000.bin" --steps "$STEPS" --batch-size 1 --seq-len "$SEQ" --grad-accum "$GA" \
            --log-every 1 --eval-every 0 --save-every -1 --adam-moments bf16 --moments-dir "$WORK/state" \
            --host-mem 7100MiB --out "$WORK/run" > "$WORK/log_${mode}_$round" 2>&1 || { tail -5 "$WORK/log_${mode}_$round"; exit 1; }
        python3 - "$WORK/log_${mode}_$round" "$mode" "$round" "$(cat "$WORK/rss")" <<'PY'
import re, sys
log, mode, rnd, rss = sys.argv[1:]
rows = re.findall(r"engine: step ([0-9.]+) s \| host update ([0-9.]+) s .*?blocks ([0-9.]+) s .*?disk read waited "
                  r"([0-9.]+) s, disk write waited ([0-9.]+) s, .*?, (\d) records? read ahead", open(log).read())
rows = [tuple(map(float, r)) for r in rows][2:]
n = len(rows)
mean = [sum(r[i] for r in rows) / n for i in range(6)]
print(f"{mode} round {rnd}: {n} steps: step {mean[0]:.3f} s, host update {mean[1]:.3f} s, waited for updated blocks "
      f"{mean[2]:.3f} s, disk read waited {mean[3]:.3f} s, disk write waited {mean[4]:.3f} s, records read ahead "
      f"{mean[5]:.0f}; peak RSS {int(rss) / 2**20:.2f} GiB")
PY
    done
done

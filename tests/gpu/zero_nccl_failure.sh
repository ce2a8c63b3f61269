#!/usr/bin/env bash
# An NCCL failure ends every rank with a message and a non-zero exit, within the timeouts:
#   tests/gpu/zero_nccl_failure.sh [ZTRAIN]        (default build/worker/ztrain; ctest passes its own)
# Provoked with one GPU: `ztrain launch --nproc 2` with both ranks on CUDA device 0 (LOCAL_RANK=0 for
# both), which NCCL refuses when the communicator is created ("Duplicate GPU detected"). Both ranks must
# name the failed NCCL call, and the job must fail, well within ZT_RDZV_TIMEOUT_S / ZT_COMM_TIMEOUT_S.
# Exits 77 (skipped) without a GPU.
set -u
ZTRAIN="${1:-build/worker/ztrain}"
PY="${PYTHON:-python3}"
if ! nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
  echo "no GPU visible: skipped"
  exit 77
fi
dir=$(mktemp -d "${TMPDIR:-/tmp}/zt_nccl_failure_XXXXXX")
trap 'rm -rf "$dir"' EXIT
"$PY" - "$dir" <<'PY'
import struct, sys
n = 20000
with open(f"{sys.argv[1]}/t_train_000.bin", "wb") as f:
    f.write(struct.pack("<256i", 20240520, 1, n, *([0] * 253)))
    f.write(struct.pack(f"<{n}H", *[(i * 7) % 200 for i in range(n)]))
PY
echo '{"model_type": "gpt2", "n_layer": 2, "n_head": 2, "n_embd": 128, "n_positions": 64, "vocab_size": 200}' \
  > "$dir/model.json"
start=$(date +%s)
ZT_RDZV_TIMEOUT_S=30 ZT_COMM_TIMEOUT_S=30 timeout 120 "$ZTRAIN" launch --nproc 2 -- sh -c \
  "LOCAL_RANK=0 exec '$ZTRAIN' train --model '$dir/model.json' --train-data '$dir/t_train_000.bin' --device cuda \
   --steps 3 --batch-size 2 --seq-len 64 --out '$dir/run_'\$RANK" > "$dir/log" 2>&1
rc=$?
took=$(( $(date +%s) - start ))
cat "$dir/log" | grep -iE "nccl|error" | head -6
fail=0
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || { echo "FAIL: the job exited with $rc (expected a failure, not a hang)"; fail=1; }
for r in 0 1; do
  grep -q "\[r$r\].*NCCL init failed on rank $r of 2" "$dir/log" || { echo "FAIL: rank $r did not name the NCCL failure"; fail=1; }
done
echo "job exit status $rc after ${took} s"
exit $fail

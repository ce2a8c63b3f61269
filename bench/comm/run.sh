#!/usr/bin/env bash
# All-gather, reduce-scatter and all-reduce bus bandwidth on the GPUs of this host, through ztrain's NCCL
# backend: one rank per GPU, for every rank count from 2 to the number of GPUs (or the counts given).
#   bench/comm/run.sh [BUILD_DIR] [NPROC...]       e.g. bench/comm/run.sh build 2 4 8
# NVLink SHARP (NVLS) stays off (NCCL_NVLS_ENABLE=0) unless the environment sets it.
set -eu
BUILD="${1:-build}"
shift || true
ZTRAIN="$BUILD/worker/ztrain"
BENCH="$BUILD/bench/comm/bench_collectives"
for f in "$ZTRAIN" "$BENCH"; do
  [ -x "$f" ] || { echo "run.sh: $f is missing: build with -DZT_CUDA=ON -DZT_BUILD_TESTS=ON (NCCL found)" >&2; exit 2; }
done
export NCCL_NVLS_ENABLE="${NCCL_NVLS_ENABLE:-0}"
GPUS=$(nvidia-smi -L 2>/dev/null | wc -l)
COUNTS="$*"
if [ -z "$COUNTS" ]; then
  COUNTS=""
  n=2
  while [ "$n" -le "$GPUS" ]; do COUNTS="$COUNTS $n"; n=$((n * 2)); done
fi
[ -n "$COUNTS" ] || { echo "run.sh: $GPUS GPU(s) visible; collectives need 2 or more" >&2; exit 77; }
for n in $COUNTS; do
  echo "== $n ranks (of $GPUS GPUs), NCCL_NVLS_ENABLE=$NCCL_NVLS_ENABLE"
  for dt in bf16 fp32; do
    "$ZTRAIN" launch --nproc "$n" --master-port $((29600 + n)) -- "$BENCH" --dtype "$dt" --min-mib 1 --max-mib 1024 \
      --iters 20
  done
done

#!/usr/bin/env bash
# `ztrain train --plan-only`: the memory plan of a GPU run, printed without allocating, reading data or
# training, on a machine with or without a GPU (without one it plans for a GPU of --gpu-mem bytes, and
# --host-mem stands for the RAM of the machine planned for). Each case checks the exit status, the lines
# the plan must print or the one error line it must give, and that no run directory was made.
# Exits 77 (skipped) for a ztrain built without the CUDA backend.
#   bash tests/cli/plan_only.sh PATH/TO/ztrain        (ctest runs it as cli_plan_only)
set -u
ZT=$(realpath "$1")
SRC=$(cd "$(dirname "$0")/../.." && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/zt_plan_XXXXXX")
trap 'rm -rf "$WORK"' EXIT
cd "$WORK" || exit 1
passed=0
failed=0

# plan NAME WANT_RC PATTERN... -- ARGS: runs `ztrain train --device cuda --plan-only ARGS`; its exit status must
# be WANT_RC, every PATTERN (extended regex) must be in its output, and no run directory may appear.
plan() {
  local name=$1 want=$2
  shift 2
  local pats=()
  while [ "$1" != "--" ]; do pats+=("$1"); shift; done
  shift
  rm -rf runs out
  timeout 120 "$ZT" train --device cuda --plan-only --out out "$@" > "$name.log" 2>&1
  local rc=$? why=""
  [ "$rc" = "$want" ] || why="exit $rc, expected $want"
  for p in "${pats[@]}"; do
    grep -Eq -- "$p" "$name.log" || why="${why:+$why; }no line matches '$p'"
  done
  [ -e out ] && why="${why:+$why; }it made the run directory"
  if [ -z "$why" ]; then
    passed=$((passed + 1)); echo "ok   $name"
  else
    failed=$((failed + 1)); echo "FAIL $name: $why"; tail -n 6 "$name.log" | sed 's/^/  | /'
  fi
}

"$ZT" train --model "$SRC/bench/gpt2-124m.json" --device cuda --plan-only --gpu-mem 11GiB > probe.log 2>&1
if grep -q "built without the CUDA backend" probe.log; then
  echo "skipped: this ztrain has no CUDA backend"
  exit 77
fi
# with a GPU visible the plan is for it (--gpu-mem caps it); without one, for a GPU of --gpu-mem
nogpu=1
grep -q "no CUDA device visible" probe.log || nogpu=0
mkdir -p moments

# GPT-2 124M under 11 GiB: fits, three plan lines, no data needed
plan fits_124m 0 '^.*plan: GPU [0-9.]+ [GMK]iB of 11.0 GiB \(--gpu-mem\)' '^.*plan: host ' \
  'plan: --plan-only: the run fits' -- --model "$SRC/bench/gpt2-124m.json" --batch-size 8 --seq-len 1024 --gpu-mem 11GiB
# GPT-2 1558M with its optimizer on a 4 GiB GPU: refused, naming the cap
plan too_big_1558m 1 'ERROR .*--gpu-mem' -- --model "$SRC/bench/gpt2-1558m.json" --batch-size 8 --seq-len 1024 \
  --gpu-mem 4GiB --optimizer gpu --weights gpu
# GPT-2 124M under 2 GiB on a machine of 3600 MiB of RAM: part of the state tiers onto the disk (a few GiB)
plan tiers_124m 0 'plan: host .* of --host-mem 3.52 GiB' 'on disk' 'plan: disk [0-9.]+ [GM]iB of .* free in ' \
  'plan: --plan-only: the run fits' -- --model "$SRC/bench/gpt2-124m.json" --batch-size 8 --seq-len 1024 \
  --gpu-mem 2GiB --host-mem 3600MiB --optimizer cpu --checkpointing all --adam-moments bf16 \
  --moments-dir moments --save-every -1
# the LLaMA-2-7B shape under 11 GiB on a machine of 16 GiB of RAM: refused with the minimum
plan llama7b_h16 1 "ERROR --host-mem 16.0 GiB is below this run's smallest plan: at least [0-9.]+ GiB" -- \
  --model "$SRC/bench/llama-7b.json" --batch-size 8 --seq-len 1024 --gpu-mem 11GiB --host-mem 16GiB \
  --optimizer cpu --checkpointing all --adam-moments bf16 --moments-dir moments --save-every -1
if [ "$nogpu" = 1 ]; then
  # without a GPU the plan needs to know the GPU's memory
  plan no_gpu_no_cap 1 'ERROR --plan-only: no CUDA device is visible.*add --gpu-mem SIZE' -- \
    --model "$SRC/bench/gpt2-124m.json"
fi
# a CPU run plans as it builds its model: --plan-only asks for --device cuda
timeout 60 "$ZT" train --model "$SRC/bench/gpt2-124m.json" --device cpu --plan-only > cpu.log 2>&1
rc=$?
if [ "$rc" = 2 ] && grep -q "plans a GPU run's memory: add --device cuda" cpu.log; then
  passed=$((passed + 1)); echo "ok   plan_only_on_cpu"
else
  failed=$((failed + 1)); echo "FAIL plan_only_on_cpu: exit $rc"; tail -n 3 cpu.log | sed 's/^/  | /'
fi
echo "cli_plan_only: $passed passed, $failed failed"
[ "$failed" = 0 ]

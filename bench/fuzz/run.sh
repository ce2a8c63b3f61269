#!/usr/bin/env bash
# Builds the libFuzzer harnesses of tests/fuzz (clang, -DZT_FUZZ=ON: AddressSanitizer and UBSan in the
# whole build) and runs every one of them over its committed seed corpus, splitting SECONDS between them.
# Prints one table line per harness: seconds, executions, executions per second, corpus size, crashes.
# Exits 1 when any harness crashed (the input that did it is kept under build-fuzz/artifacts/<harness>/).
#
#   bench/fuzz/run.sh SECONDS [HARNESS...]   fuzz (all harnesses unless named)
#   bench/fuzz/run.sh --seeds                write the seed corpora tests/fuzz/corpus/<harness>/ again
#
#   ZT_FUZZ_BUILD_DIR   build folder (default build-fuzz); new inputs found go to BUILD_DIR/corpus/<harness>/
#   ZT_FUZZ_JOBS        compile jobs (default: the number of cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD

HARNESSES=(fuzz_state_service fuzz_rendezvous fuzz_safetensors fuzz_token_shard fuzz_train_config
           fuzz_checkpoint_manifest fuzz_snapshot_manifest fuzz_store_record fuzz_tokenizer_json)
# Harnesses whose inputs are JSON get the JSON dictionary (number forms, literals, the manifests' keys).
declare -A DICT=([fuzz_train_config]=json [fuzz_checkpoint_manifest]=json [fuzz_snapshot_manifest]=json
                 [fuzz_safetensors]=json [fuzz_tokenizer_json]=json)

usage() { sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; }
if [ $# -lt 1 ]; then usage; exit 2; fi

build=${ZT_FUZZ_BUILD_DIR:-build-fuzz}
if ! command -v clang >/dev/null 2>&1; then
  echo "fuzz: clang is not installed; run scripts/install-deps.sh (it installs clang and libomp-dev)" >&2
  exit 1
fi
mkdir -p "$build/logs"
CC=clang cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DZT_FUZZ=ON -DZT_CUDA=OFF \
  -DZT_BUILD_TESTS=OFF >"$build/logs/configure.log" 2>&1 || { cat "$build/logs/configure.log"; exit 1; }
cmake --build "$build" -j "${ZT_FUZZ_JOBS:-$(nproc)}" --target fuzz >"$build/logs/build.log" 2>&1 ||
  { tail -40 "$build/logs/build.log"; exit 1; }

if [ "$1" = "--seeds" ]; then
  for h in "${HARNESSES[@]}"; do
    rm -rf "tests/fuzz/corpus/$h.new"
    mkdir -p "tests/fuzz/corpus/$h.new"
    ZT_SOURCE_DIR=$root ZT_FUZZ_WRITE_SEEDS="tests/fuzz/corpus/$h.new" "$build/tests/fuzz/$h"
    # Keep the regression inputs (regress-*) that crashed an earlier version.
    cp tests/fuzz/corpus/"$h"/regress-* "tests/fuzz/corpus/$h.new/" 2>/dev/null || true
    rm -rf "tests/fuzz/corpus/$h"
    mv "tests/fuzz/corpus/$h.new" "tests/fuzz/corpus/$h"
    echo "fuzz: $h: $(ls "tests/fuzz/corpus/$h" | wc -l) seeds"
  done
  exit 0
fi

total=$1
shift
case "$total" in '' | *[!0-9]*) echo "fuzz: SECONDS must be a whole number, not '$total'" >&2; exit 2 ;; esac
if [ $# -gt 0 ]; then HARNESSES=("$@"); fi
per=$(( total / ${#HARNESSES[@]} ))
[ "$per" -ge 1 ] || per=1

export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=1:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export ZT_SOURCE_DIR=$root
printf '%-26s %8s %12s %10s %8s %8s\n' harness seconds executions exec/s corpus crashes
failed=0
for h in "${HARNESSES[@]}"; do
  bin="$build/tests/fuzz/$h"
  [ -x "$bin" ] || { echo "fuzz: no harness $h (known: ${HARNESSES[*]})" >&2; exit 2; }
  work="$build/corpus/$h"
  art="$build/artifacts/$h"
  rm -rf "$art"
  mkdir -p "$work" "$art"
  log="$build/logs/$h.log"
  dict=()
  [ -n "${DICT[$h]:-}" ] && dict=("-dict=tests/fuzz/${DICT[$h]}.dict")
  # The working corpus first (new inputs go there), then the committed seeds (read only).
  rc=0
  "$bin" -max_total_time="$per" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
    -artifact_prefix="$art/" "${dict[@]}" "$work" "tests/fuzz/corpus/$h" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  secs=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  crashes=$(find "$art" -type f | wc -l)
  if [ "$rc" -ne 0 ]; then
    crashes=$(( crashes > 0 ? crashes : 1 ))
    failed=1
  fi
  printf '%-26s %8s %12s %10s %8s %8s\n' "$h" "$per" "${execs:-?}" "${secs:-?}" "$(ls "$work" | wc -l)" "$crashes"
  if [ "$rc" -ne 0 ]; then
    echo "fuzz: $h failed (exit $rc); its log: $log; the input: $(ls -t "$art" | head -1 | sed "s|^|$art/|")" >&2
    grep -E "ERROR: |runtime error|SUMMARY" "$log" | head -5 >&2 || true
  fi
done
exit $failed

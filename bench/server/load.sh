#!/bin/sh
# Load: CLIENTS training runs (default 64) against one ztrain-server at once, each pushing, committing and
# pulling STEPS steps and checking every step against its own AdamW, bit for bit (bench_load.c). The
# server runs with --max-memory sized for exactly CLIENTS runs (36 bytes per parameter on the RAM store)
# plus half a run, so that one more run is refused. Prints bench_load's line, then a table with the
# push latency percentiles and the server's peak RSS against its memory limit.
#
# usage: bench/server/load.sh BUILD_DIR [CLIENTS] [STEPS] [NUMEL]
#   BUILD_DIR  a build folder holding server/ztrain-server and bench/server/bench_load
#   NUMEL      parameters of each run's large block (default 65536; the other block has 1000)
set -eu
B=$1
CLIENTS=${2:-64}
STEPS=${3:-20}
NUMEL=${4:-65536}
PER_RUN=$((36 * (NUMEL + 1000)))
LIMIT=$((PER_RUN * CLIENTS + PER_RUN / 2))
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT # a signal ends the run (through cleanup), it does not go on to the next row
trap 'exit 143' TERM
field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }

mkfifo "$TMP/ready"
"$B/server/ztrain-server" --listen 127.0.0.1:0 --log-level warn --max-memory "$LIMIT" >"$TMP/ready" \
    2>"$TMP/server.log" &
SERVER_PID=$!
read -r line <"$TMP/ready"
port=$(field port "$line")
[ -n "$port" ] || { echo "ztrain-server did not start:"; cat "$TMP/server.log"; exit 1; }
rc=0
result=$("$B/bench/server/bench_load" "127.0.0.1:$port" "$CLIENTS" "$STEPS" "$NUMEL" "$SERVER_PID" 2>"$TMP/bench.log") || rc=$?
echo "$result"
if [ "$rc" -ne 0 ]; then
    echo "bench_load failed (exit $rc):"
    head -20 "$TMP/bench.log"
fi
limit_mib=$(awk -v l="$LIMIT" 'BEGIN { printf "%.1f", l / 1048576 }')
echo "| clients | steps each | commits checked | mismatches | extra run | push p50 ms | push p99 ms | push max ms | step p50 ms | step p99 ms | run RAM MiB (limit) | server peak RSS MiB | wall s |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
echo "| $(field clients "$result") | $STEPS | $(field commits "$result") | $(field mismatches "$result") | $(field extra_run "$result") |" \
    "$(field push_p50_ms "$result") | $(field push_p99_ms "$result") | $(field push_max_ms "$result") |" \
    "$(field step_p50_ms "$result") | $(field step_p99_ms "$result") | $(field server_run_ram_mib "$result") ($limit_mib) |" \
    "$(field server_peak_rss_mib "$result") | $(field wall_s "$result") |"
kill "$SERVER_PID"
wait "$SERVER_PID" || rc=1
SERVER_PID=
exit "$rc"

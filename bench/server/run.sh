#!/bin/sh
# State-service throughput on one machine, printed as a table: gRPC push (PushGradients, 1 MiB chunks)
# and pull (PullParams) of MIB x REPS MiB of fp32 through the worker's client to a ztrain-server on
# loopback, against a raw loopback TCP copy of the same bytes.
#
# The client's CPU seconds per GiB are printed too: they depend less on other processes' load than the
# throughput does. So is the busiest thread of the client and of the server during the push and the
# pull (the fraction of the transfer's wall time it was on a CPU, and its name): one near 1.0 limits
# the transfer.
#
# The raw copy and the gRPC run alternate TRIALS times and the table gives the median of each (other
# processes on a small machine make single runs noisy); every trial's numbers are printed first.
#
# usage: bench/server/run.sh BUILD_DIR [MIB] [REPS] [TRIALS]
#   BUILD_DIR  a build folder holding server/ztrain-server and bench/server/bench_{raw_tcp,state_rpc}
#   MIB        size of the shard pushed and pulled (default 256); REPS repetitions (default 4: 1 GiB)
#   TRIALS     alternating measurements of each (default 3)
set -eu
B=$1
MIB=${2:-256}
REPS=${3:-4}
TRIALS=${4:-3}
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT INT TERM

field() { # field NAME LINE: the value of NAME=value in LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
: >"$TMP/raw"
: >"$TMP/push"
: >"$TMP/pull"
: >"$TMP/push_cpu"
: >"$TMP/pull_cpu"
for f in push_top pull_top server_push_top server_pull_top; do : >"$TMP/$f"; done
i=0
while [ "$i" -lt "$TRIALS" ]; do
    # A fresh server per trial, so that every trial registers the same new run.
    rm -f "$TMP/ready"
    mkfifo "$TMP/ready"
    "$B/server/ztrain-server" --listen 127.0.0.1:0 --log-level warn >"$TMP/ready" 2>"$TMP/server.log" &
    SERVER_PID=$!
    read -r line <"$TMP/ready"
    port=$(field port "$line")
    [ -n "$port" ] || { echo "ztrain-server did not start:"; cat "$TMP/server.log"; exit 1; }
    raw=$("$B/bench/server/bench_raw_tcp" $((MIB * REPS)))
    rpc=$("$B/bench/server/bench_state_rpc" "127.0.0.1:$port" "$MIB" "$REPS" "$SERVER_PID")
    echo "trial $((i + 1)): $raw; $rpc"
    field gib_s "$raw" >>"$TMP/raw"
    field push_gib_s "$rpc" >>"$TMP/push"
    field pull_gib_s "$rpc" >>"$TMP/pull"
    field push_cpu_s_gib "$rpc" >>"$TMP/push_cpu"
    field pull_cpu_s_gib "$rpc" >>"$TMP/pull_cpu"
    for f in push_top pull_top server_push_top server_pull_top; do field $f "$rpc" >>"$TMP/$f"; done
    kill "$SERVER_PID"
    wait "$SERVER_PID" || true
    SERVER_PID=
    i=$((i + 1))
done
r=$(median <"$TMP/raw")
p=$(median <"$TMP/push")
q=$(median <"$TMP/pull")
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
echo "| measure ($((MIB * REPS)) MiB of fp32, loopback, $(nproc) cores, median of $TRIALS) | GiB/s | vs raw TCP copy |"
echo "| --- | --- | --- |"
echo "| raw TCP copy (1 MiB send/recv, one connection) | $r | 100% |"
echo "| gRPC PushGradients (1 MiB chunks, ztrain client -> ztrain-server) | $p | $(pct "$p" "$r") |"
echo "| gRPC PullParams (1 MiB chunks) | $q | $(pct "$q" "$r") |"
echo "client CPU seconds per GiB (median; the client process, gRPC threads included): push $(median <"$TMP/push_cpu"), pull $(median <"$TMP/pull_cpu")"
top() { # top FILE: the median fraction of lines F:NAME, then each NAME with the number of trials it was the busiest
    v=$(cut -d: -f1 <"$1" | median)
    names=$(cut -d: -f2 <"$1" | sort | uniq -c | sort -rn | awk '{ printf "%s%s x%d", (NR > 1 ? ", " : ""), $2, $1 }')
    echo "$v ($names)"
}
echo "busiest thread, share of the transfer's wall time on a CPU (median; thread names x trials): client push" \
    "$(top "$TMP/push_top"), pull $(top "$TMP/pull_top"); server push $(top "$TMP/server_push_top")," \
    "pull $(top "$TMP/server_pull_top")"

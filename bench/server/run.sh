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
# Streams: the client splits a push or pull of a large shard over concurrent streams (client.h), by
# default a quarter of the cores (1 to 4; ZT_STATE_STREAMS overrides it). STREAMS="1 4" measures each
# listed count in every trial, one after the other after the raw copy (a fresh server each), so that the
# settings alternate as the trials do; the table then has a push and a pull row per count. Without
# STREAMS the client's default is measured.
#
# usage: [STREAMS="1 4"] bench/server/run.sh BUILD_DIR [MIB] [REPS] [TRIALS]
#   BUILD_DIR  a build folder holding server/ztrain-server and bench/server/bench_{raw_tcp,state_rpc}
#   MIB        size of the shard pushed and pulled (default 256); REPS repetitions (default 4: 1 GiB)
#   TRIALS     alternating measurements of each (default 3)
set -eu
B=$1
MIB=${2:-256}
REPS=${3:-4}
TRIALS=${4:-3}
SETTINGS=${STREAMS:-default}
TMP=$(mktemp -d)
SERVER_PID=
cleanup() {
    if [ -n "$SERVER_PID" ]; then kill "$SERVER_PID" 2>/dev/null || true; wait "$SERVER_PID" 2>/dev/null || true; fi
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT # a signal ends the run (through cleanup), it does not go on to the next row
trap 'exit 143' TERM

field() { # field NAME LINE: the value of NAME=value in LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
: >"$TMP/raw"
for s in $SETTINGS; do
    for f in push pull push_cpu pull_cpu push_faults pull_faults streams push_top pull_top server_push_top server_pull_top; do
        : >"$TMP/$f.$s"
    done
done
i=0
while [ "$i" -lt "$TRIALS" ]; do
    raw=$("$B/bench/server/bench_raw_tcp" $((MIB * REPS)))
    echo "trial $((i + 1)): $raw"
    field gib_s "$raw" >>"$TMP/raw"
    for s in $SETTINGS; do
        # A fresh server per measurement, so that every one registers the same new run.
        rm -f "$TMP/ready"
        mkfifo "$TMP/ready"
        "$B/server/ztrain-server" --listen 127.0.0.1:0 --log-level warn >"$TMP/ready" 2>"$TMP/server.log" &
        SERVER_PID=$!
        read -r line <"$TMP/ready"
        port=$(field port "$line")
        [ -n "$port" ] || { echo "ztrain-server did not start:"; cat "$TMP/server.log"; exit 1; }
        if [ "$s" = default ]; then
            rpc=$("$B/bench/server/bench_state_rpc" "127.0.0.1:$port" "$MIB" "$REPS" "$SERVER_PID")
        else
            rpc=$(ZT_STATE_STREAMS=$s "$B/bench/server/bench_state_rpc" "127.0.0.1:$port" "$MIB" "$REPS" "$SERVER_PID")
        fi
        echo "trial $((i + 1)), streams $s: $rpc"
        field push_gib_s "$rpc" >>"$TMP/push.$s"
        field pull_gib_s "$rpc" >>"$TMP/pull.$s"
        field push_cpu_s_gib "$rpc" >>"$TMP/push_cpu.$s"
        field pull_cpu_s_gib "$rpc" >>"$TMP/pull_cpu.$s"
        field push_faults_gib "$rpc" >>"$TMP/push_faults.$s"
        field pull_faults_gib "$rpc" >>"$TMP/pull_faults.$s"
        field streams "$rpc" >>"$TMP/streams.$s"
        for f in push_top pull_top server_push_top server_pull_top; do field $f "$rpc" >>"$TMP/$f.$s"; done
        kill "$SERVER_PID"
        wait "$SERVER_PID" || true
        SERVER_PID=
    done
    i=$((i + 1))
done
r=$(median <"$TMP/raw")
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
top() { # top FILE: the median fraction of lines F:NAME, then each NAME with the number of trials it was the busiest
    v=$(cut -d: -f1 <"$1" | median)
    names=$(cut -d: -f2 <"$1" | sort | uniq -c | sort -rn | awk '{ printf "%s%s x%d", (NR > 1 ? ", " : ""), $2, $1 }')
    echo "$v ($names)"
}
echo "| measure ($((MIB * REPS)) MiB of fp32, loopback, $(nproc) cores, median of $TRIALS) | GiB/s | vs raw TCP copy |"
echo "| --- | --- | --- |"
echo "| raw TCP copy (1 MiB send/recv, one connection) | $r | 100% |"
for s in $SETTINGS; do
    n=$(median <"$TMP/streams.$s")
    [ -n "$n" ] || n=1 # a client from before the streams option prints no count: it used one
    p=$(median <"$TMP/push.$s")
    q=$(median <"$TMP/pull.$s")
    echo "| gRPC PushGradients (1 MiB chunks, ztrain client -> ztrain-server, $n streams) | $p | $(pct "$p" "$r") |"
    echo "| gRPC PullParams (1 MiB chunks, $n streams) | $q | $(pct "$q" "$r") |"
done
for s in $SETTINGS; do
    n=$(median <"$TMP/streams.$s")
    [ -n "$n" ] || n=1 # a client from before the streams option prints no count: it used one
    echo "$n streams: client CPU seconds per GiB (median; the client process, gRPC threads included): push" \
        "$(median <"$TMP/push_cpu.$s"), pull $(median <"$TMP/pull_cpu.$s"); minor page faults per GiB: push" \
        "$(median <"$TMP/push_faults.$s"), pull $(median <"$TMP/pull_faults.$s")"
    echo "$n streams: busiest thread, share of the transfer's wall time on a CPU (median; thread names x trials):" \
        "client push $(top "$TMP/push_top.$s"), pull $(top "$TMP/pull_top.$s"); server push" \
        "$(top "$TMP/server_push_top.$s"), pull $(top "$TMP/server_pull_top.$s")"
done

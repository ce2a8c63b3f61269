#!/bin/sh
# The cost of TLS and mutual TLS on the state service, on loopback: gRPC pushes and pulls of MIB x REPS MiB
# of fp32 through the worker's client (bench_state_rpc) to a ztrain-server that speaks plaintext, TLS
# (--tls-cert/--tls-key; the client checks the server against its CA) or mutual TLS (--tls-ca as well: the
# client presents a certificate of that CA), TRIALS times in alternation, median of each, as a table.
# The certificates are made with openssl as docs/security.md describes (a CA, a server certificate for
# 127.0.0.1, a client certificate). Also the client's CPU seconds per GiB, which move less with other
# processes' load than the throughput does.
#
# usage: bench/server/tls.sh BUILD_DIR [MIB] [REPS] [TRIALS]   (defaults 256 4 3)
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
trap cleanup EXIT
trap 'exit 130' INT # a signal ends the run (through cleanup), it does not go on to the next row
trap 'exit 143' TERM
(cd "$TMP" &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=bench-ca" &&
    openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" &&
    printf "subjectAltName=IP:127.0.0.1" >san.ext &&
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext &&
    openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=bench-worker" &&
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2) \
    >"$TMP/openssl.log" 2>&1 || { cat "$TMP/openssl.log"; exit 1; }

field() { echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }
MODES="plain tls mtls"
for m in $MODES; do for f in push pull push_cpu pull_cpu; do : >"$TMP/$f.$m"; done; done
i=0
while [ "$i" -lt "$TRIALS" ]; do
    for m in $MODES; do
        extra=
        [ "$m" != plain ] && extra="--tls-cert $TMP/server.pem --tls-key $TMP/server.key"
        [ "$m" = mtls ] && extra="$extra --tls-ca $TMP/ca.pem"
        rm -f "$TMP/ready"
        mkfifo "$TMP/ready"
        # shellcheck disable=SC2086
        "$B/server/ztrain-server" --listen 127.0.0.1:0 --log-level warn $extra >"$TMP/ready" 2>"$TMP/server.log" &
        SERVER_PID=$!
        read -r line <"$TMP/ready"
        port=$(field port "$line")
        [ -n "$port" ] || { echo "ztrain-server did not start:"; cat "$TMP/server.log"; exit 1; }
        case $m in
        plain) rpc=$("$B/bench/server/bench_state_rpc" "127.0.0.1:$port" "$MIB" "$REPS" "$SERVER_PID") ;;
        tls) rpc=$(ZT_BENCH_TLS_CA=$TMP/ca.pem "$B/bench/server/bench_state_rpc" "127.0.0.1:$port" "$MIB" "$REPS" "$SERVER_PID") ;;
        mtls) rpc=$(ZT_BENCH_TLS_CA=$TMP/ca.pem ZT_BENCH_TLS_CERT=$TMP/client.pem ZT_BENCH_TLS_KEY=$TMP/client.key \
            "$B/bench/server/bench_state_rpc" "127.0.0.1:$port" "$MIB" "$REPS" "$SERVER_PID") ;;
        esac
        echo "trial $((i + 1)), $m: $rpc"
        field push_gib_s "$rpc" >>"$TMP/push.$m"
        field pull_gib_s "$rpc" >>"$TMP/pull.$m"
        field push_cpu_s_gib "$rpc" >>"$TMP/push_cpu.$m"
        field pull_cpu_s_gib "$rpc" >>"$TMP/pull_cpu.$m"
        kill "$SERVER_PID"
        wait "$SERVER_PID" || true
        SERVER_PID=
    done
    i=$((i + 1))
done
pct() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.0f%%", 100 * a / b }'; }
P=$(median <"$TMP/push.plain")
Q=$(median <"$TMP/pull.plain")
echo "| security ($((MIB * REPS)) MiB of fp32, loopback, $(nproc) cores, median of $TRIALS) | push GiB/s | vs plaintext | pull GiB/s | vs plaintext | client CPU s/GiB push, pull |"
echo "| --- | ---: | ---: | ---: | ---: | --- |"
for m in $MODES; do
    p=$(median <"$TMP/push.$m")
    q=$(median <"$TMP/pull.$m")
    echo "| $m | $p | $(pct "$p" "$P") | $q | $(pct "$q" "$Q") | $(median <"$TMP/push_cpu.$m"), $(median <"$TMP/pull_cpu.$m") |"
done

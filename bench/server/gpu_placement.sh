#!/usr/bin/env bash
# GPU workers with their optimizer in ztrain-servers against the embedded host AdamW, on one machine:
# tokens/s of `ztrain train --device cuda --precision bf16 --optimizer cpu` and `--optimizer server` against
# NSERVERS ztrain-servers on loopback (each with --snapshot-dir and a bearer token), for GPT-2 124M
# (grad_accum 1 and 8) and 1558M (grad_accum 4), batch 8 x 1024, printed as one table; every server row
# once with the bytes over TCP and once through shared memory (TRANSPORTS). The server rows
# also give the bytes per second of the step's wire traffic (gradient shards pushed, parameters pulled)
# over the push and pull time of the engine's step breakdown, against a raw loopback TCP copy
# (bench_raw_tcp) measured in the same run. After the table, each row's last step breakdown (push, server
# update, pull, waits), from its log.
#
#   bench/server/gpu_placement.sh [BUILD_DIR] [OUT_DIR]
#     BUILD_DIR  holds worker/ztrain, server/ztrain-server, bench/server/bench_raw_tcp (default build); the
#                script builds nothing, so binaries built elsewhere (a CUDA build, -DZT_CUDA=ON) run as they are;
#                with BUILD_DIR/devlibs (bench/server/carry_libs.sh BUILD_DIR on the machine that built them)
#                those libraries come first, and CUDA's are looked for on this machine
#     OUT_DIR    logs (default bench-out/server)
#   CASES="124m:1 124m:8 1558m:4"  model:grad_accum pairs;  NSERVERS="1"  e.g. "1 2 4" for the aggregate
#   TRANSPORTS="tcp shm"  how the server rows move their bytes, each a row beside the other in the same call:
#   tcp (--server-shm off: loopback TCP) and shm (shared memory, the default for a server on this host)
#   STREAMS="default"  e.g. "1 2 4": concurrent streams (connections) per push or pull of a shard
#   (ZT_STATE_STREAMS; default: a quarter of the cores, 1 to 4)
#   STEPS=12: tokens/s is the mean over steps 5..STEPS (metrics.jsonl)
#   TLS=1: also the server rows with TLS and with mutual TLS (certificates made with openssl, as
#   docs/security.md describes)
#   SERVER_ENV="VAR=value ...": environment for the servers only (e.g. OMP_WAIT_POLICY=passive)
#   With N > 1 servers on the box, each gets --threads (cores / N) for its AdamW, as servers sharing a
#   machine should be started; one server uses every core (its default).
set -u
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
B="${1:-build}"
OUT_DIR="${2:-bench-out/server}"
CASES="${CASES:-124m:1 124m:8 1558m:4}"
NSERVERS="${NSERVERS:-1}"
STEPS="${STEPS:-12}"
TLS="${TLS:-0}"
STREAMS="${STREAMS:-default}"
TRANSPORTS="${TRANSPORTS:-tcp shm}"
SERVER_ENV="${SERVER_ENV:-}"
CORES=$(nproc)
PY="${PYTHON:-python3}"
if [ -d "$B/devlibs" ]; then # binaries built elsewhere: their libraries, then this machine's CUDA libraries
  cudalibs=""
  for l in 'libcublasLt.so.*' 'libnccl.so.*' 'libcudart.so.*'; do
    d=$(dirname "$(find /usr/local /opt /usr/lib -name "$l" 2>/dev/null | head -1)")
    [ "$d" != . ] && cudalibs="$cudalibs:$d"
  done
  export LD_LIBRARY_PATH="$(cd "$B/devlibs" && pwd)$cudalibs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  if ldd "$B/worker/ztrain" | grep -q "not found"; then
    echo "gpu_placement: $B/worker/ztrain misses libraries:"; ldd "$B/worker/ztrain" | grep "not found"; exit 1
  fi
fi
mkdir -p "$OUT_DIR"
OUT_DIR="$(cd "$OUT_DIR" && pwd)"
DATA="${TMPDIR:-/tmp}/zt_bench_data"
mkdir -p "$DATA"
[ -f "$DATA/rnd_train_000.bin" ] || "$PY" "$ROOT/bench/make_shards.py" "$DATA/rnd" 4000000
WORK="$(mktemp -d)"
PIDS=""
cleanup() {
  for p in $PIDS; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  rm -rf "$WORK"
}
trap cleanup EXIT
trap 'exit 130' INT # a signal ends the run (through cleanup), it does not go on to the next row
trap 'exit 143' TERM
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$WORK/token"

if [ "$TLS" = 1 ]; then # a CA, a server certificate for 127.0.0.1, a client certificate
  (cd "$WORK" &&
   openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.pem -days 2 -subj "/CN=bench-ca" &&
   openssl req -newkey rsa:2048 -nodes -keyout server.key -out server.csr -subj "/CN=127.0.0.1" &&
   printf "subjectAltName=IP:127.0.0.1" > san.ext &&
   openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out server.pem -days 2 -extfile san.ext &&
   openssl req -newkey rsa:2048 -nodes -keyout client.key -out client.csr -subj "/CN=bench-worker" &&
   openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out client.pem -days 2) \
    > "$OUT_DIR/openssl.log" 2>&1 || { echo "openssl failed: $OUT_DIR/openssl.log"; exit 1; }
fi

# start_servers N SECURITY: N servers sharing runs (plain | tls | mtls); their list in $WORK/list
start_servers() {
  local n=$1 sec=$2 list="" i=0 extra=""
  [ "$sec" != plain ] && extra="--tls-cert $WORK/server.pem --tls-key $WORK/server.key"
  [ "$sec" = mtls ] && extra="$extra --tls-ca $WORK/ca.pem"
  [ "$n" -gt 1 ] && extra="$extra --threads $(( CORES / n > 0 ? CORES / n : 1 ))"
  while [ "$i" -lt "$n" ]; do
    rm -rf "$WORK/snap$i" "$WORK/ready$i"
    mkfifo "$WORK/ready$i"
    # shellcheck disable=SC2086
    env $SERVER_ENV "$B/server/ztrain-server" --listen 127.0.0.1:0 --server-index "$i" --server-count "$n" --token-file "$WORK/token" \
      --snapshot-dir "$WORK/snap$i" --log-level warn $extra > "$WORK/ready$i" 2> "$OUT_DIR/server$i.log" &
    PIDS="$PIDS $!"
    local line port
    read -r line < "$WORK/ready$i"
    port=$(echo "$line" | tr ' ' '\n' | sed -n 's/^port=//p')
    [ -n "$port" ] || { echo "ztrain-server did not start: $OUT_DIR/server$i.log"; exit 1; }
    list="$list${list:+,}127.0.0.1:$port"
    i=$((i + 1))
  done
  echo "$list" > "$WORK/list"
}
stop_servers() {
  for p in $PIDS; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  PIDS=""
}

# train NAME MODEL ACCUM FLAGS...: prints "tokens/s wire_GiB/s" (wire "-" without a server breakdown)
train() {
  local name=$1 model=$2 accum=$3
  shift 3
  rm -rf "$WORK/run"
  "$B/worker/ztrain" train --model "$ROOT/bench/gpt2-$model.json" --train-data "$DATA/rnd_train_000.bin" \
    --device cuda --precision bf16 --batch-size 8 --seq-len 1024 --grad-accum "$accum" --steps "$STEPS" \
    --warmup 2 --log-every 1 --eval-every 0 --save-every -1 --out "$WORK/run" "$@" > "$OUT_DIR/$name.log" 2>&1 ||
    { echo "ztrain failed: $OUT_DIR/$name.log" >&2; echo "- -"; return; }
  cp "$WORK/run/metrics.jsonl" "$OUT_DIR/$name.metrics.jsonl"
  "$PY" - "$WORK/run/metrics.jsonl" "$OUT_DIR/$name.log" $((8 * 1024 * accum)) <<'PY'
import json, re, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l]
tokens = int(sys.argv[3])
timed = [r for r in rows if r["step"] >= 5]
tps = tokens * len(timed) / sum(tokens / r["tokens_per_s"] for r in timed)
mib = secs = 0.0
for line in open(sys.argv[2]):
    m = re.search(r"server push ([0-9.]+) s .* pull ([0-9.]+) s .* wire ([0-9.]+) MiB", line)
    if m:
        secs += float(m.group(1)) + float(m.group(2))
        mib += float(m.group(3))
print("%.0f %s" % (tps, "%.2f" % (mib / 1024 / secs) if secs > 0 else "-"))
PY
}

raw=$("$B/bench/server/bench_raw_tcp" 4096 | tr ' ' '\n' | sed -n 's/^gib_s=//p')
# same_losses A B: "yes" when the two runs' losses are the same numbers at every step (the placements give
# the same bits), else "NO"
same_losses() {
  "$PY" - "$OUT_DIR/$1.metrics.jsonl" "$OUT_DIR/$2.metrics.jsonl" <<'PY' 2>/dev/null || echo "-"
import json, sys
def losses(p):
    return [(r["step"], r["loss"]) for r in map(json.loads, open(p)) if "loss" in r]
a, b = losses(sys.argv[1]), losses(sys.argv[2])
print("yes" if a and a == b else "NO")
PY
}

[ -n "$SERVER_ENV" ] && echo "servers started with: $SERVER_ENV"
echo "| model, grad_accum (bf16, 8 x 1024) | placement | tokens/s | vs --optimizer cpu | wire GiB/s (push + pull) | vs raw TCP copy ($raw GiB/s) | losses = cpu's |"
echo "| --- | --- | ---: | ---: | ---: | ---: | --- |"
secs="plain"
ROWS=""
[ "$TLS" = 1 ] && secs="plain tls mtls"
for c in $CASES; do
  model=${c%%:*}
  accum=${c##*:}
  read -r cpu _ < <(train "cpu_${model}_$accum" "$model" "$accum" --optimizer cpu)
  ROWS="$ROWS cpu_${model}_$accum"
  echo "| GPT-2 $model, $accum | --optimizer cpu (embedded host AdamW) | $cpu | 100% | - | - | - |"
  for n in $NSERVERS; do
    for sec in $secs; do
      for st in $STREAMS; do
       for via in $TRANSPORTS; do
        start_servers "$n" "$sec"
        flags=(--optimizer server --servers "$(cat "$WORK/list")" --token-file "$WORK/token")
        [ "$sec" != plain ] && flags+=(--tls-ca "$WORK/ca.pem")
        [ "$sec" = mtls ] && flags+=(--tls-cert "$WORK/client.pem" --tls-key "$WORK/client.key")
        [ "$via" = tcp ] && flags+=(--server-shm off)
        name="server${n}_${sec}_${via}_${model}_$accum"
        if [ "$st" = default ]; then
          read -r tps wire < <(train "$name" "$model" "$accum" "${flags[@]}")
        else
          name="server${n}_${sec}_${via}_s${st}_${model}_$accum"
          read -r tps wire < <(ZT_STATE_STREAMS="$st" train "$name" "$model" "$accum" "${flags[@]}")
        fi
        stop_servers
        # the transport the run really used, from its step breakdown ("via shared memory" / "via TCP")
        used=$(grep -o '(via [^)]*)' "$OUT_DIR/$name.log" | tail -1 | sed 's/^(via //; s/)$//')
        pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (a + 0 > 0 && b + 0 > 0) printf "%.0f%%", 100 * a / b; else printf "-" }'; }
        echo "| GPT-2 $model, $accum | --optimizer server, $n server(s) on this host, $sec, ${used:-$via}, streams $st | $tps | $(pct "$tps" "$cpu") | $wire | $(pct "$wire" "$raw") | $(same_losses "cpu_${model}_$accum" "$name") |"
        ROWS="$ROWS $name"
       done
      done
    done
  done
done

# Where each row's last step went (the engine's step breakdown), so that the table's gaps can be read off
# this output alone.
echo ""
echo "Step breakdown of each row's last step:"
for name in $ROWS; do
  line=$(grep 'engine: step ' "$OUT_DIR/$name.log" 2>/dev/null | tail -1 | sed 's/^.*engine: step /step /')
  echo "- $name: ${line:-(no breakdown in $OUT_DIR/$name.log)}"
done

#!/bin/sh
# Placement cpu against placement server on one machine, CPU training (--device cpu): tokens per second of
# `ztrain train --optimizer cpu` (AdamW in the process) and of `--optimizer server` against NSERVERS
# ztrain-servers on loopback (each started with --snapshot-dir, as training needs), the same small GPT-2,
# data and flags, printed as a table. Each server count gets two rows run in the same trial: the bytes over
# TCP (--server-shm off) and through shared memory (the default for servers on this host). The server rows also give the bytes per second that the step's wire
# traffic (the gradient shards pushed, the parameters pulled) reached while it was moving: the bytes of a
# step over the push and pull time the engine's step breakdown reports, against a raw loopback TCP copy
# (bench_raw_tcp) of the same bytes measured in the same run.
#
# The figures are CPU figures: the model computes on the same cores as the servers and the wire, so they
# say what the server path costs beside CPU compute, not what a GPU worker sees (bench/server/gpu_placement.sh).
#
# usage: [NSERVERS="1 2"] [TRIALS=3] [LAYERS=6 EMBD=384 HEADS=6 BATCH=4 SEQ=128] [VIAS="tcp shm"]
#        bench/server/cpu_placement.sh BUILD_DIR [STEPS] [EXTRA_TRAIN_FLAGS...]
#   BUILD_DIR  a build folder holding worker/ztrain, server/ztrain-server and bench/server/bench_raw_tcp
#   STEPS      optimizer steps per run (default 12); tokens/s is that of steps 3..STEPS (metrics.jsonl)
#   LAYERS, EMBD, HEADS, BATCH, SEQ  the model (GPT-2, vocabulary 4096) and the micro-batch: a wide model
#              and a small batch make the optimizer's bytes (pushes, the servers' AdamW, pulls) most of a step
#   VIAS       the server rows' transports (tcp: --server-shm off; shm: shared memory)
# Each server row also gives the mean of the step breakdown's "AdamW on the servers" and "worker copies" (the
# pulled bytes the worker copied itself, per step; builds before that field print "-").
set -eu
B=$1
STEPS=${2:-12}
shift
[ $# -gt 0 ] && shift
EXTRA="$*"
SERVERS=${NSERVERS:-1}
TRIALS=${TRIALS:-3}
LAYERS=${LAYERS:-6}
EMBD=${EMBD:-384}
HEADS=${HEADS:-6}
BATCH=${BATCH:-4}
SEQ=${SEQ:-128}
VIAS=${VIAS:-tcp shm}
TMP=$(mktemp -d)
PIDS=
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    rm -rf "$TMP"
}
trap cleanup EXIT
trap 'exit 130' INT # a signal ends the run (through cleanup), it does not go on to the next row
trap 'exit 143' TERM

median() { sort -n | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

cat >"$TMP/model.json" <<EOF
{"model_type": "gpt2", "n_layer": $LAYERS, "n_head": $HEADS, "n_embd": $EMBD, "n_positions": $SEQ, "vocab_size": 4096}
EOF
python3 - "$TMP" <<'EOF'
import random, struct, sys
r = random.Random(1)
for name, n in (("train_000.bin", 1 << 18), ("val_000.bin", 1 << 14)):
    toks = [r.randrange(4096) for _ in range(n)]
    with open("%s/%s" % (sys.argv[1], name), "wb") as f:
        f.write(struct.pack("<256i", *([20240520, 1, n] + [0] * 253)))
        f.write(struct.pack("<%dH" % n, *toks))
EOF
COMMON="--device cpu --model $TMP/model.json --train-data $TMP/train_*.bin --batch-size $BATCH --seq-len $SEQ
 --grad-accum 1 --steps $STEPS --warmup 2 --log-every 1 --eval-every 0 --eval-batches 1 --save-every 0 $EXTRA"

start_servers() { # start_servers N: N servers sharing runs; their list in $TMP/list
    list=
    i=0
    while [ "$i" -lt "$1" ]; do
        rm -rf "$TMP/ready$i" "$TMP/snap$i" # a fresh server: no snapshot of the last trial's run
        mkfifo "$TMP/ready$i"
        "$B/server/ztrain-server" --listen 127.0.0.1:0 --server-index "$i" --server-count "$1" \
            --snapshot-dir "$TMP/snap$i" --log-level warn >"$TMP/ready$i" 2>"$TMP/server$i.log" &
        PIDS="$PIDS $!"
        read -r line <"$TMP/ready$i"
        port=$(echo "$line" | tr ' ' '\n' | sed -n 's/^port=//p')
        [ -n "$port" ] || { echo "ztrain-server did not start:"; cat "$TMP/server$i.log"; exit 1; }
        list="$list${list:+,}127.0.0.1:$port"
        i=$((i + 1))
    done
    echo "$list" >"$TMP/list"
}
stop_servers() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
    PIDS=
}

run() { # run NAME FLAGS...: one training run; prints tokens/s; keeps the log in $TMP/NAME.log
    name=$1
    shift
    rm -rf "$TMP/out-$name"
    # shellcheck disable=SC2086
    "$B/worker/ztrain" train $COMMON --out "$TMP/out-$name" "$@" >"$TMP/$name.log" 2>&1 ||
        { echo "ztrain train $name failed:" >&2; tail -20 "$TMP/$name.log" >&2; exit 1; }
    # the steps' tokens over their seconds, from step 3 on (the first ones fault pages in and connect)
    python3 - "$TMP/out-$name/metrics.jsonl" <<'EOF2'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"loss"' in l and json.loads(l)["step"] >= 3]
print("%.0f" % (len(rows) / sum(1.0 / r["tokens_per_s"] for r in rows)))
EOF2
}

# the wire: bytes the steps after the first moved over the seconds the engine's breakdown gives push and pull
wire() { # wire LOG: "GiB/s" of the steps' pushes and pulls, or "-" when the log has no server breakdown
    awk '/engine: step .* server push/ {
            n++; if (n == 1) next
            for (i = 1; i <= NF; i++) {
                if ($i == "push") { p += $(i + 1) }
                if ($i == "pull") { q += $(i + 1) }
                if ($i == "wire") { b += $(i + 1) }
            }
        }
        END { if (p + q > 0) printf "%.2f\n", b / (p + q) / 1024; else printf "-\n" }' "$1"
}

# the servers' own update and the pulled bytes the worker copied (MiB), per step after the first, or "-"
server_fields() { # server_fields LOG: "ADAMW_S COPIED_MIB"
    python3 - "$1" <<'EOF2'
import re, sys
units = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}
own, copied = [], []
for line in open(sys.argv[1]):
    if "engine: step" not in line or "server push" not in line:
        continue
    m = re.search(r"AdamW on the servers ([0-9.]+) s", line)
    if m:
        own.append(float(m.group(1)))
    m = re.search(r"worker copies ([0-9.]+) ([KMGT]?i?B) in", line)
    if m:
        copied.append(float(m.group(1)) * units[m.group(2)] / (1 << 20))
own, copied = own[1:], copied[1:]
print("%s %s" % ("%.3f" % (sum(own) / len(own)) if own else "-", "%.1f" % (sum(copied) / len(copied)) if copied else "-"))
EOF2
}

: >"$TMP/cpu"
for s in $SERVERS; do for via in $VIAS; do : >"$TMP/$via$s"; : >"$TMP/wire$via$s"; : >"$TMP/own$via$s"; done; done
: >"$TMP/raw"
t=0
while [ "$t" -lt "$TRIALS" ]; do
    run cpu --optimizer cpu >>"$TMP/cpu"
    for s in $SERVERS; do
        for via in $VIAS; do
            flag=
            [ "$via" = tcp ] && flag="--server-shm off"
            start_servers "$s"
            # shellcheck disable=SC2086
            run "$via$s" --optimizer server --servers "$(cat "$TMP/list")" $flag >>"$TMP/$via$s"
            stop_servers
            grep -q "(via $([ "$via" = tcp ] && echo TCP || echo shared memory))" "$TMP/$via$s.log" ||
                { echo "the $via$s run did not move its bytes as asked:" >&2; grep "via" "$TMP/$via$s.log" | tail -2 >&2; exit 1; }
            wire "$TMP/$via$s.log" >>"$TMP/wire$via$s"
            server_fields "$TMP/$via$s.log" >>"$TMP/own$via$s"
        done
    done
    "$B/bench/server/bench_raw_tcp" 256 | tr ' ' '\n' | sed -n 's/^gib_s=//p' >>"$TMP/raw"
    t=$((t + 1))
done
c=$(median <"$TMP/cpu")
r=$(median <"$TMP/raw")
pct() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0 && a != "-") printf "%.0f%%", 100 * a / b; else printf "-" }'; }
echo "| --device cpu, GPT-2 $LAYERS x $EMBD, batch $BATCH x $SEQ, $STEPS steps, $(nproc) cores, median of $TRIALS | tokens/s | vs --optimizer cpu | wire GiB/s during push and pull | vs raw TCP copy ($r GiB/s) | AdamW on the servers, s a step | worker copies, MiB a step |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
echo "| --optimizer cpu (in process) | $c | 100% | - | - | - | - |"
for s in $SERVERS; do
    for via in $VIAS; do
        v=$(median <"$TMP/$via$s")
        w=$(median <"$TMP/wire$via$s")
        a=$(cut -d' ' -f1 "$TMP/own$via$s" | median)
        k=$(cut -d' ' -f2 "$TMP/own$via$s" | median)
        what="TCP (--server-shm off)"
        [ "$via" = shm ] && what="shared memory"
        echo "| --optimizer server, $s ztrain-server(s) on this host, $what | $v | $(pct "$v" "$c") | $w | $(pct "$w" "$r") | $a | $k |"
    done
done

#!/bin/sh
# The state server's update against the embedded host AdamW (bench_server_update), for one or more builds in
# alternating rounds (a loaded machine drifts; alternating spreads that over every build), printed as one
# table: the best and the median over the rounds of each variant's best update.
#
# usage: [ROUNDS=3] [ITERS=4] bench/server/update.sh N_MILLIONS THREADS[,THREADS...] f32|bf16 BUILD_DIR...
#   N_MILLIONS  parameters (GPT-2 layers of n_embd 1600; e.g. 300)
#   THREADS     the Adam thread counts, e.g. 1,2 (the VM) or 8,16 (the H200 machine)
#   f32|bf16    the gradient's dtype (f32: --grad-accum > 1 or W > 1; bf16: one rank, --grad-accum 1)
#   BUILD_DIR   build folders holding bench/server/bench_server_update (e.g. a build of the commit before and
#               one of the commit after a change)
set -eu
N=$1
TH=$2
G=$3
shift 3
ROUNDS=${ROUNDS:-3}
ITERS=${ITERS:-4}
TABLE_IN=$(mktemp)
trap 'rm -f "$TABLE_IN"' EXIT
r=1
while [ "$r" -le "$ROUNDS" ]; do
    for b in "$@"; do
        "$b/bench/server/bench_server_update" "$N" "$TH" "$G" "$ITERS" | grep '^bench_server_update variant=' |
            sed "s|^|build=$b round=$r |" >>"$TABLE_IN"
    done
    r=$((r + 1))
done
head -1 "$TABLE_IN" >/dev/null
python3 - "$TABLE_IN" "$N" "$G" <<'PY'
import re, statistics, sys
rows = {}
order = []
for line in open(sys.argv[1]):
    m = re.match(r'build=(\S+) round=(\d+) bench_server_update variant="([^"]+)" threads=(\d+) best_s=([0-9.]+) '
                 r'ns_param=([0-9.]+)', line)
    if not m:
        continue
    key = (m.group(1), m.group(3), int(m.group(4)))
    if key not in rows:
        rows[key] = []
        order.append(key)
    rows[key].append((float(m.group(5)), float(m.group(6))))
print("| build | variant | threads | best s | median s | ns / parameter (best) | vs embedded (medians) |")
print("|---|---|---:|---:|---:|---:|---:|")
for key in order:
    b, variant, th = key
    s = [x[0] for x in rows[key]]
    ns = min(x[1] for x in rows[key])
    base = statistics.median(x[0] for x in rows[(b, "embedded (in place)", th)])
    print("| %s | %s | %d | %.4f | %.4f | %.3f | %.2fx |" % (b, variant, th, min(s), statistics.median(s), ns,
                                                          statistics.median(s) / base))
PY

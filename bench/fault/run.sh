#!/bin/sh
# Fault injection, the full run of RELIABILITY.md: for every configuration (CPU ranks W = 1, 2, 3; the
# server's store RAM or NVMe) TRIALS runs with a ztrain-server killed with SIGKILL at a random moment,
# KILLS runs with the kill while the server writes a snapshot and KILLS while the worker writes a
# checkpoint, each restarted on the same --snapshot-dir and checked byte for byte against the run without
# a fault; then WORKER_KILLS runs with a worker rank killed at a random moment and WORKER_KILLS while it
# writes a checkpoint, each continued with --resume (also for W = 1, 2, 3 with --optimizer cpu, no server)
# (tests/fault/fault_injection.py). Prints every trial, then a table; the JSON record goes to
# RESULTS_JSON (default fault-results.json). Servers run with --snapshot-commits 1 unless ZT_FAULT_SERVER_FLAGS
# says otherwise (ZT_FAULT_SERVER_FLAGS="" measures servers that snapshot only at checkpoints).
#
# usage: bench/fault/run.sh BUILD_DIR [TRIALS] [KILLS] [RESULTS_JSON] [WORKER_KILLS]
#   BUILD_DIR  a build folder holding server/ztrain-server and worker/ztrain
set -eu
cd "$(dirname "$0")/../.."
B=$1
TRIALS=${2:-30}
KILLS=${3:-10}
RESULTS_JSON=${4:-fault-results.json}
WORKER_KILLS=${5:-15}
PY=.venv/bin/python3
[ -x "$PY" ] || PY=python3
exec "$PY" tests/fault/fault_injection.py "$B/server/ztrain-server" "$B/worker/ztrain" \
    --configs w1-ram,w1-nvme,w2-ram,w2-nvme,w3-ram,w3-nvme,w1-cpu,w2-cpu,w3-cpu --trials "$TRIALS" \
    --snapshot-kills "$KILLS" --checkpoint-kills "$KILLS" --worker-kills "$WORKER_KILLS" \
    --seed "${ZT_FAULT_SEED:-2026}" \
    --server-flags "${ZT_FAULT_SERVER_FLAGS---snapshot-commits 1}" --json "$RESULTS_JSON"

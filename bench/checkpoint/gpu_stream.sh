#!/usr/bin/env bash
# Checkpoints of GPU runs with the host AdamW's state on disk, streamed from the records: at W = 1 and, with two
# GPUs, W = 2 (`ztrain launch`), a run with --moments-dir (and one under --host-mem with the masters on disk at
# W = 1) writes the model.safetensors and optim.safetensors of the same run with its state in RAM, byte for
# byte, and a run stopped at step 4 and resumed from its streamed checkpoint ends with the same files.
#   bench/checkpoint/gpu_stream.sh [ZTRAIN] [WORK_DIR]   (CAP: the --host-mem of the last run, default 2080MiB: a GPU plan counts 2 GiB for the process;
#   DEVICE_FLAGS='--device cpu' runs the same checks on CPU ranks)
set -euo pipefail
ZTRAIN=${1:-build/worker/ztrain}
WORK=${2:-/tmp/zt_ckpt_gpu}
HERE=$(cd "$(dirname "$0")" && pwd)
PY=${PYTHON:-python3}
rm -rf "$WORK" && mkdir -p "$WORK"
"$PY" "$HERE/../make_shards.py" "$WORK/data" 100000 256
cat > "$WORK/model.json" <<'JSON'
{"model_type": "gpt2", "n_layer": 4, "n_head": 4, "n_embd": 256, "n_positions": 64, "vocab_size": 256,
 "tie_word_embeddings": true}
JSON
common=(${DEVICE_FLAGS:---device cuda --optimizer cpu --weights host} --model "$WORK/model.json" --train-data "$WORK/data_train_000.bin"
        --seq-len 32 --batch-size 4 --log-every 4 --schedule nodecay --save-every 4)
run() { local name=$1; shift; "$@" > "$WORK/log_$name" 2>&1 || { echo "FAIL $name"; tail -20 "$WORK/log_$name"; exit 1; }; }
same() {
    for f in model.safetensors optim.safetensors; do
        cmp "$1/$f" "$2/$f" || { echo "FAIL: $1/$f differs from $2/$f"; exit 1; }
    done
    echo "ok: $1 = $2"
}
for W in 1 2; do
    if [ "$W" = 2 ] && [ "$(nvidia-smi -L 2>/dev/null | wc -l)" -lt 2 ]; then echo "skip W=2: one GPU"; continue; fi
    launch=("$ZTRAIN")
    [ "$W" = 2 ] && launch=("$ZTRAIN" launch --nproc 2)
    mkdir -p "$WORK/m$W"
    run ram$W "${launch[@]}" train "${common[@]}" --steps 8 --out "$WORK/ram$W"
    run disk$W "${launch[@]}" train "${common[@]}" --steps 8 --moments-dir "$WORK/m$W" --out "$WORK/disk$W"
    grep -q "streamed from the state on disk" "$WORK/log_disk$W" || { echo "FAIL: disk$W did not stream"; exit 1; }
    same "$WORK/disk$W/ckpt_000008" "$WORK/ram$W/ckpt_000008"
    run half$W "${launch[@]}" train "${common[@]}" --steps 4 --moments-dir "$WORK/m$W" --out "$WORK/half$W"
    run rest$W "${launch[@]}" train "${common[@]}" --steps 8 --moments-dir "$WORK/m$W" --out "$WORK/half$W" \
        --resume "$WORK/half$W"
    same "$WORK/half$W/ckpt_000008" "$WORK/ram$W/ckpt_000008"
done
# W = 1 under a --host-mem that puts masters on disk too: the same files again (the plan line says the tiers)
if "$ZTRAIN" train "${common[@]}" --steps 8 --moments-dir "$WORK/m1" --host-mem "${CAP:-2080MiB}" --out "$WORK/cap1" \
        > "$WORK/log_cap1" 2>&1; then
    grep "plan: host" "$WORK/log_cap1"
    same "$WORK/cap1/ckpt_000008" "$WORK/ram1/ckpt_000008"
else
    grep -E "ERROR" "$WORK/log_cap1"; echo "(set CAP to what the message says fits)"
fi
echo "all ok"

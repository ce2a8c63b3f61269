#!/bin/sh
# Benchmarks of offload/ on one machine, printed as a table: CPU AdamW (f32 and bf16 gradients) against
# torch.optim.AdamW's default and against a STREAM triad, and the NVMe tier against dd (and fio, where
# installed) on the same disk and size.
#
# usage: bench/offload/run.sh BIN_DIR [THREADS] [DISK_DIR] [GIB]
#   BIN_DIR   folder holding bench_cpu_adam, bench_stream and bench_store (a Release build)
#   THREADS   threads for AdamW, torch and STREAM (default: all cores)
#   DISK_DIR  directory on the disk under test (default: /var/tmp/zt-bench); it is emptied
#   GIB       bytes written and read by the disk tests (default: 4); 0 skips them (bench/offload/disk.sh
#             compares the tier's reads with dd and raw io_uring reads more fairly, in alternating rounds)
# Logs of every run go to $LOG_DIR (default: the current directory); MPARAMS sets the AdamW size in millions.
# fio is optional (Debian: apt-get install fio); without it the fio columns read "none". It is not needed
# to build or test ztrain. Its baseline runs at the tier's queue depth and request size (QD 32, 1 MiB,
# io_uring, O_DIRECT): the fair ceiling for a queue-depth engine, where dd keeps one request in flight.
set -eu
BIN=$1
THREADS=${2:-$(nproc)}
DISK=${3:-/var/tmp/zt-bench}
GIB=${4:-4}
LOG=${LOG_DIR:-.}
HERE=$(cd "$(dirname "$0")" && pwd)
N=${MPARAMS:-200} # million parameters (default 200: 5.6 GB of AdamW traffic per step, far beyond every cache)
PY=${PYTHON:-python3}

field() { # field NAME LINE: the value of NAME=value in LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}

stream=$("$BIN/bench_stream" $((N * 2)) "$THREADS" 10 | tee -a "$LOG/stream.log")
adam_f32=$("$BIN/bench_cpu_adam" $N "$THREADS" f32 none 10 | tee -a "$LOG/adam.log")
adam_bf16=$("$BIN/bench_cpu_adam" $N "$THREADS" bf16 bf16 10 | tee -a "$LOG/adam.log")
torch_f32=$($PY "$HERE/torch_adamw.py" $N "$THREADS" f32 5 2>>"$LOG/torch.err" | tee -a "$LOG/torch.log" || echo "mparams_s=nan")
torch_bf16=$($PY "$HERE/torch_adamw.py" $N "$THREADS" bf16 5 2>>"$LOG/torch.err" | tee -a "$LOG/torch.log" || echo "mparams_s=nan")

dd_w=none; dd_r=none; fio_w=none; fio_r=none; store=none
if [ "$GIB" != 0 ]; then
    mkdir -p "$DISK"
    rm -f "$DISK"/*.zts "$DISK/dd.bin"
    # dd: one 1 MiB request at a time, direct I/O, the same size as the store test.
    dd_w=$(dd if=/dev/zero of="$DISK/dd.bin" bs=1M count=$((GIB * 1024)) oflag=direct 2>&1 | tail -1 | tee -a "$LOG/dd.log")
    dd_r=$(dd if="$DISK/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | tee -a "$LOG/dd.log")
    rm -f "$DISK/dd.bin"
    if command -v fio >/dev/null 2>&1; then
        fio_w=$(fio --name=w --filename="$DISK/fio.bin" --rw=write --bs=1M --size=${GIB}G --direct=1 --ioengine=io_uring \
            --iodepth=32 --output-format=terse --terse-version=3 | tee -a "$LOG/fio.log" | awk -F';' '{printf "%.2f", $48/1e6*1.024}')
        fio_r=$(fio --name=r --filename="$DISK/fio.bin" --rw=read --bs=1M --size=${GIB}G --direct=1 --ioengine=io_uring \
            --iodepth=32 --output-format=terse --terse-version=3 | tee -a "$LOG/fio.log" | awk -F';' '{printf "%.2f", $7/1e6*1.024}')
        rm -f "$DISK/fio.bin"
    fi
    store=$("$BIN/bench_store" "$DISK" "$GIB" 256 32 1024 4 | tee -a "$LOG/store.log")
fi

dd_gbs() { # GB/s from dd's last line ("4294967296 bytes (...) copied, 2.82 s, 1.5 GB/s"): bytes / seconds
    if [ "$1" = none ]; then echo none; return; fi
    echo "$1" | awk '{printf "%.2f", $1 / $(NF-3) / 1e9}'
}
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b+0 > 0) printf "%.2f", a / b; else printf "n/a" }'; }

tri=$(field gbytes_s "$stream")
af=$(field mparams_s "$adam_f32"); ab=$(field mparams_s "$adam_bf16")
tf=$(field mparams_s "$torch_f32"); tb=$(field mparams_s "$torch_bf16")
agf=$(field gbytes_s "$adam_f32"); agb=$(field gbytes_s "$adam_bf16")
sw=$(field write_gbytes_s "$store"); sr=$(field read_gbytes_s "$store")
dw=$(dd_gbs "$dd_w"); dr=$(dd_gbs "$dd_r")

echo
echo "| measure | ztrain | baseline | ratio |"
echo "| --- | --- | --- | --- |"
echo "| AdamW f32 grads, ${THREADS} threads, M params/s ($(field isa "$adam_f32")) | $af | torch AdamW default: $tf | $(ratio "$af" "$tf") |"
echo "| AdamW bf16 grads + bf16 out, M params/s | $ab | torch AdamW default (bf16 grads cast): $tb | $(ratio "$ab" "$tb") |"
echo "| AdamW f32 achieved bandwidth, GB/s (28 B/param) | $agf | STREAM triad: $tri | $(ratio "$agf" "$tri") |"
echo "| AdamW bf16 achieved bandwidth, GB/s (28 B/param) | $agb | STREAM triad: $tri | $(ratio "$agb" "$tri") |"
[ "$GIB" = 0 ] && exit 0
echo "| NVMe tier write ${GIB} GiB, GB/s (QD 32, 1 MiB) | $sw | dd oflag=direct: $dw; fio QD32: $fio_w | $(ratio "$sw" "$dw") (dd), $(ratio "$sw" "$fio_w") (fio) |"
echo "| NVMe tier read ${GIB} GiB, GB/s (QD 32, 1 MiB) | $sr | dd iflag=direct: $dr; fio QD32: $fio_r | $(ratio "$sr" "$dr") (dd), $(ratio "$sr" "$fio_r") (fio) |"

#!/bin/sh
# NVMe tier reads against dd and raw io_uring reads of the same disk, alternated round by round (the
# order rotates every round) so that a virtual disk whose rate drifts is compared fairly; then a sweep of
# queue depth and request size, raw and tier side by side, to choose the tier's defaults. Prints every
# measurement as it is made, then a table of medians.
#
# usage: bench/offload/disk.sh BIN_DIR [DISK_DIR] [GIB] [ROUNDS] [SWEEP_GIB]
#   BIN_DIR    folder holding bench_store and bench_rawio (a Release build)
#   DISK_DIR   directory on the disk under test (default /var/tmp/zt-disk); its test files are removed
#   GIB        bytes of each read in the rounds (default 4); ROUNDS rounds (default 3)
#   SWEEP_GIB  bytes of each read in the sweep (default 2; 0 skips the sweep)
# BASE_STORE=PATH adds a second bench_store (for example one built from an older offload/store.c) to
# every round, reading the same records.
#
# What is compared: dd (one 1 MiB request at a time, O_DIRECT), bench_rawio (QD 32 x 1 MiB through
# io_uring, O_DIRECT, no checksum: what fio --iodepth=32 --bs=1M measures) and the tier (records of
# 256 MiB, QD 32 x 1 MiB, 4 buffers in a pipeline, CRC-32C checked), all reading files written just
# before the rounds.
set -eu
BIN=$1
DISK=${2:-/var/tmp/zt-disk}
GIB=${3:-4}
ROUNDS=${4:-3}
SWEEP=${5:-2}
BASE=${BASE_STORE:-}
REC=256 # MiB per tier record
TMP=$(mktemp -d)
mkdir -p "$DISK/tier"
rm -f "$DISK/tier/"*.zts "$DISK/dd.bin"
cleanup() { rm -rf "$DISK/tier" "$DISK/dd.bin" "$TMP"; }
trap cleanup EXIT
trap 'exit 130' INT # a signal ends the run (through cleanup), it does not go on to the next row
trap 'exit 143' TERM

field() { # field NAME LINE: the value of NAME=value in LINE
    echo "$2" | tr ' ' '\n' | sed -n "s/^$1=//p"
}
dd_gbs() { # GB/s from dd's last line ("4294967296 bytes (...) copied, 2.82 s, 1.5 GB/s"): bytes / seconds
    awk '{printf "%.2f", $1 / $(NF-3) / 1e9}'
}
median() { sort -n | awk '{ v[NR] = $1 } END { if (NR) print v[int((NR + 1) / 2)]; else print "none" }'; }
minmax() { sort -n | awk 'NR == 1 { lo = $1 } { hi = $1 } END { printf "%s - %s", lo, hi }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b+0 > 0) printf "%.0f%%", 100 * a / b; else printf "n/a" }'; }

echo "== disk"
echo "directory $DISK on $(df --output=source "$DISK" | tail -1) ($(findmnt -no FSTYPE,OPTIONS -T "$DISK"))"
for q in /sys/block/*/queue; do
    d=$(basename "$(dirname "$q")")
    case $d in loop*|ram*|zram*) continue ;; esac
    echo "$d: scheduler $(cat "$q/scheduler"), nr_requests $(cat "$q/nr_requests"), max_sectors_kb" \
        "$(cat "$q/max_sectors_kb") (hw $(cat "$q/max_hw_sectors_kb")), max_segments $(cat "$q/max_segments")," \
        "hw queues $(ls "$q/../mq" 2>/dev/null | wc -l), rotational $(cat "$q/rotational")"
done

echo "== writing the files read below ($GIB GiB each)"
dd_w=$(dd if=/dev/zero of="$DISK/dd.bin" bs=1M count=$((GIB * 1024)) oflag=direct 2>&1 | tail -1)
echo "dd write bs=1M oflag=direct: $(echo "$dd_w" | dd_gbs) GB/s"
tw=$("$BIN/bench_store" "$DISK/tier" "$GIB" $REC 32 1024 4 write)
echo "$tw"
if command -v filefrag >/dev/null 2>&1; then # file layout: a fragmented file may read slower
    echo "layout: dd.bin $(filefrag "$DISK/dd.bin" | sed 's/.*: //'), tier record 0 $(filefrag "$DISK/tier/r1-b0-s0.zts" \
        | sed 's/.*: //')"
fi

# The readers of one round, in the order of the first round.
set -- dd raw tier
[ -n "$BASE" ] && set -- "$@" base
n=$#
read_one() { # read_one NAME: one read of GIB GiB; prints its line and appends its GB/s to $TMP/NAME
    case $1 in
        dd) v=$(dd if="$DISK/dd.bin" of=/dev/null bs=1M iflag=direct 2>&1 | tail -1 | dd_gbs)
            echo "dd read bs=1M iflag=direct: $v GB/s" ;;
        raw) l=$("$BIN/bench_rawio" read "$DISK/dd.bin" "$GIB" 32 1024); v=$(field gbytes_s "$l"); echo "$l" ;;
        tier) l=$("$BIN/bench_store" "$DISK/tier" "$GIB" $REC 32 1024 4 read); v=$(field read_gbytes_s "$l")
            echo "tier: $l" ;;
        base) l=$("$BASE" "$DISK/tier" "$GIB" $REC 32 1024 4 read); v=$(field read_gbytes_s "$l")
            echo "base tier: $l" ;;
    esac
    echo "$v" >>"$TMP/$1"
}
r=0
while [ "$r" -lt "$ROUNDS" ]; do
    echo "== round $((r + 1))"
    k=0
    while [ "$k" -lt "$n" ]; do
        i=$(((k + r) % n + 1))
        eval "name=\${$i}"
        read_one "$name"
        k=$((k + 1))
    done
    r=$((r + 1))
done

if [ "$SWEEP" != 0 ]; then
    echo "== sweep: $SWEEP GiB per read; raw io_uring and the tier (4 buffers) at the same queue depth and request size"
    echo "dd read bs=4M iflag=direct: $(dd if="$DISK/dd.bin" of=/dev/null bs=4M count=$((SWEEP * 256)) iflag=direct 2>&1 \
        | tail -1 | dd_gbs) GB/s"
    for c in "1 1024" "4 1024" "8 1024" "32 1024" "64 1024" "1 4096" "4 4096" "16 4096" "128 256"; do
        set -- $c
        raw=$(field gbytes_s "$("$BIN/bench_rawio" read "$DISK/dd.bin" "$SWEEP" "$1" "$2")")
        tier=$(field read_gbytes_s "$("$BIN/bench_store" "$DISK/tier" "$SWEEP" $REC "$1" "$2" 4 read)")
        echo "qd $1 io_kib $2: raw $raw GB/s, tier $tier GB/s ($(ratio "$tier" "$raw") of raw)"
    done
    for b in 1 2 8; do
        echo "tier qd 32 io_kib 1024 bufs $b: $(field read_gbytes_s "$("$BIN/bench_store" "$DISK/tier" "$SWEEP" $REC 32 1024 "$b" read)") GB/s"
    done
fi

dd_r=$(median <"$TMP/dd")
raw_r=$(median <"$TMP/raw")
echo
echo "| read, $GIB GiB, GB/s ($ROUNDS rounds, $(nproc) cores) | median | min - max | median vs dd | median vs raw QD 32 |"
echo "| --- | --- | --- | --- | --- |"
echo "| dd iflag=direct, bs=1M | $dd_r | $(minmax <"$TMP/dd") | 100% | $(ratio "$dd_r" "$raw_r") |"
echo "| raw io_uring, QD 32 x 1 MiB | $raw_r | $(minmax <"$TMP/raw") | $(ratio "$raw_r" "$dd_r") | 100% |"
t=$(median <"$TMP/tier")
echo "| tier, QD 32 x 1 MiB, 4 buffers, CRC checked | $t | $(minmax <"$TMP/tier") | $(ratio "$t" "$dd_r") | $(ratio "$t" "$raw_r") |"
if [ -n "$BASE" ]; then
    t=$(median <"$TMP/base")
    echo "| base tier (BASE_STORE), same settings | $t | $(minmax <"$TMP/base") | $(ratio "$t" "$dd_r") | $(ratio "$t" "$raw_r") |"
fi
echo "write: dd $(echo "$dd_w" | dd_gbs) GB/s, tier $(field write_gbytes_s "$tw") GB/s (one each, before the rounds)"

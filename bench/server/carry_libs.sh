#!/bin/sh
# Copies the shared libraries that the binaries of a build folder need, other than the C library's and
# CUDA's own, into BUILD_DIR/devlibs, so that binaries built on one machine (a CPU VM with CUDA's compiler)
# run on a GPU machine without gRPC, protobuf-c and the rest installed. bench/server/gpu_placement.sh puts
# BUILD_DIR/devlibs first on LD_LIBRARY_PATH when it is there, and finds CUDA's libraries (cuBLASLt, NCCL,
# the runtime) on the GPU machine itself. The GPU tests of the build folder (tests/gpu/test_*) count too, and
# `. BUILD_DIR/devlibs/env.sh` on the GPU machine sets LD_LIBRARY_PATH for running them by hand.
#
#   bench/server/carry_libs.sh BUILD_DIR      (e.g. build-cuda, configured with -DZT_CUDA=ON)
set -eu
B=$1
mkdir -p "$B/devlibs"
for f in "$B/worker/ztrain" "$B/server/ztrain-server" "$B/bench/server/bench_raw_tcp"; do
    [ -x "$f" ] || { echo "carry_libs: $f is not built (cmake --build $B --target ztrain ztrain-server bench_raw_tcp)"; exit 1; }
    ldd "$f"
done >"$B/devlibs/.ldd"
for f in "$B"/tests/gpu/test_*; do
    if [ -f "$f" ] && [ -x "$f" ]; then ldd "$f" >>"$B/devlibs/.ldd"; fi
done
awk '/=>/ { print $3 }' "$B/devlibs/.ldd" | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas[^/]*|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$B/devlibs/"; done
rm -f "$B/devlibs/.ldd"
cat >"$B/devlibs/env.sh" <<'ENV'
# . BUILD_DIR/devlibs/env.sh: these libraries first, then the CUDA libraries this machine has
_d=$(cd "$(dirname "${BASH_SOURCE:-$0}")" && pwd)
for _l in 'libcublasLt.so.*' 'libnccl.so.*' 'libcudart.so.*'; do
    _p=$(find /usr/local /opt /usr/lib -name "$_l" 2>/dev/null | head -1)
    [ -n "$_p" ] && _d="$_d:$(dirname "$_p")"
done
export LD_LIBRARY_PATH="$_d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset _d _l _p
ENV
du -sh "$B/devlibs"

#!/bin/sh
# Copies the shared libraries that the binaries of a build folder need, other than the C library's and
# CUDA's own, into BUILD_DIR/devlibs, so that binaries built on one machine (a CPU VM with CUDA's compiler)
# run on a GPU machine without gRPC, protobuf-c and the rest installed. bench/server/gpu_placement.sh puts
# BUILD_DIR/devlibs first on LD_LIBRARY_PATH when it is there, and finds CUDA's libraries (cuBLASLt, NCCL,
# the runtime) on the GPU machine itself.
#
#   bench/server/carry_libs.sh BUILD_DIR      (e.g. build-cuda, configured with -DZT_CUDA=ON)
set -eu
B=$1
mkdir -p "$B/devlibs"
for f in "$B/worker/ztrain" "$B/server/ztrain-server" "$B/bench/server/bench_raw_tcp"; do
    [ -x "$f" ] || { echo "carry_libs: $f is not built (cmake --build $B --target ztrain ztrain-server bench_raw_tcp)"; exit 1; }
    ldd "$f"
done | awk '/=>/ { print $3 }' | sort -u |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libgcc_s|libstdc\+\+|libcuda|libcudart|libcublas[^/]*|libnccl)\.so' |
    while read -r lib; do cp -L "$lib" "$B/devlibs/"; done
du -sh "$B/devlibs"

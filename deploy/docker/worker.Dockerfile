# The ztrain worker image: the `ztrain` CLI built with the CUDA backend, on NVIDIA's CUDA runtime image
# (which carries NCCL and cuBLAS), running as an unprivileged user. Build from the repository's top folder:
#   docker build -f deploy/docker/worker.Dockerfile -t ztrain-worker:0.1.0 .
# Narrow the GPU architectures to build faster, e.g. --build-arg CUDA_ARCHS=90 for H100/H200 only.
# CUDA 12.x keeps the image usable on V100 (sm_70) with CUDA_ARCHS=70 and drivers from 525 on.

ARG CUDA_VERSION=12.8.1
ARG UBUNTU_VERSION=24.04

# --- build: compile ztrain with the CUDA backend -----------------------------------------------------
FROM nvidia/cuda:${CUDA_VERSION}-devel-ubuntu${UBUNTU_VERSION} AS build
ARG CUDA_ARCHS="75;80;86;89;90"
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config ca-certificates \
      libcjson-dev libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler liburing-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=ON "-DZT_CUDA_ARCHS=${CUDA_ARCHS}" -DZT_BUILD_TESTS=OFF \
 && cmake --build /build --target ztrain -j "$(nproc)" \
 && install -D -m 0755 /build/worker/ztrain /out/ztrain \
 && install -D -m 0755 deploy/docker/worker-entrypoint.sh /out/ztrain-entrypoint \
 && sh deploy/docker/runtime-packages.sh /out/ztrain > /out/runtime-packages.txt

# --- runtime: CUDA runtime + NCCL from the base, the binary and its other runtime libraries ------------
FROM nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu${UBUNTU_VERSION}
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --system --gid 10001 ztrain \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/ztrain --create-home --shell /usr/sbin/nologin ztrain
COPY --from=build /out/ztrain /out/ztrain-entrypoint /usr/local/bin/
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /home/ztrain
EXPOSE 29500
ENTRYPOINT ["/usr/local/bin/ztrain-entrypoint"]
CMD ["--help"]

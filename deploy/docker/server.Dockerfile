# The ztrain state server image: ztrain-server on a slim Debian 12 with only the shared libraries it loads,
# running as an unprivileged user. Build from the repository's top folder:
#   docker build -f deploy/docker/server.Dockerfile -t ztrain-server:0.1.0 .
# Serves gRPC on 7070 (TLS, token), grpc.health.v1 for probes on 7071, Prometheus metrics on 9090.

ARG DEBIAN_VERSION=12.11

# --- build: compile ztrain-server from source -------------------------------------------------------
FROM debian:${DEBIAN_VERSION} AS build
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      build-essential cmake pkg-config ca-certificates \
      libcjson-dev libgrpc-dev libprotobuf-c-dev protobuf-c-compiler protobuf-compiler liburing-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The server has no CUDA code; tests are built and run by CI, not here.
RUN cmake -S . -B /build -DCMAKE_BUILD_TYPE=Release -DZT_CUDA=OFF -DZT_BUILD_TESTS=OFF \
 && cmake --build /build --target ztrain-server -j "$(nproc)" \
 && install -D -m 0755 /build/server/ztrain-server /out/ztrain-server \
 && sh deploy/docker/runtime-packages.sh /out/ztrain-server > /out/runtime-packages.txt

# --- runtime: the binary and its runtime libraries only ----------------------------------------------
FROM debian:${DEBIAN_VERSION}-slim
COPY --from=build /out/runtime-packages.txt /tmp/runtime-packages.txt
RUN apt-get update \
 && xargs -a /tmp/runtime-packages.txt apt-get install -y --no-install-recommends \
 && rm -rf /var/lib/apt/lists/* /tmp/runtime-packages.txt \
 && groupadd --system --gid 10001 ztrain \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/ztrain --no-create-home --shell /usr/sbin/nologin ztrain \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/ztrain
COPY --from=build /out/ztrain-server /usr/local/bin/ztrain-server
# Numeric, so that Kubernetes' runAsNonRoot can check it.
USER 10001:10001
WORKDIR /var/lib/ztrain
EXPOSE 7070 7071 9090
ENTRYPOINT ["/usr/local/bin/ztrain-server"]

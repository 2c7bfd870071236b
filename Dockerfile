# syntax=docker/dockerfile:1
#
# history-service container image.
#
#   docker build -t history-service:dev .
#   docker run --rm history-service:dev --help
#
# Two stages: a full Rust toolchain builds the release binary; a slim Debian image of the same
# release (bookworm, so the glibc the binary was linked against is the one it runs on) carries
# only the binary and the shared libraries it loads.

ARG RUST_VERSION=1.95

# --------------------------------------------------------------------------------------------
# Builder
# --------------------------------------------------------------------------------------------
FROM rust:${RUST_VERSION}-bookworm AS builder

# rdkafka-sys (default features, no `cmake-build`) compiles the librdkafka bundled in the crate
# with librdkafka's own mklove `./configure` (a bash script) and `make libs`, which builds both
# src/ (C) and src-cpp/ (C++) and whose configure requires a C++ compiler: gcc, g++, make.
# No cmake (only for the `cmake-build` feature), no git (the sources ship inside the crate),
# no python/perl (not used by `make libs`; perl would only be needed by openssl-sys's
# `vendored` feature, which is not enabled).
#   - zlib1g-dev + pkg-config: libz-sys (rdkafka-sys's default `libz` feature) finds the system
#     zlib through pkg-config and links it dynamically (libz.so.1 at run time), and librdkafka's
#     configure compiles against <zlib.h>.
#   - libssl-dev: rdkafka's `ssl` feature (librdkafka --enable-ssl: SSL/SASL_SSL, SCRAM) and the
#     `openssl`/`postgres-openssl` crates link the system OpenSSL 3 through openssl-sys, which
#     finds it with pkg-config (libssl.so.3/libcrypto.so.3 at run time).
#   - tikv-jemalloc-sys (the binary's allocator) builds the jemalloc bundled in the crate with its
#     shipped configure script and make: gcc and make again, nothing more; linked statically.
# The rust:*-bookworm image (buildpack-deps) already ships most of these; they are listed so the
# requirement is explicit and the stage still works on a slimmer base.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        gcc g++ make pkg-config zlib1g-dev libssl-dev \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /build

# Dependency layer: build every dependency (librdkafka is by far the slowest) against stub
# sources, so that editing src/ does not rebuild them. It is only invalidated when Cargo.toml
# or Cargo.lock change. The stubs mirror the manifest's targets: [lib] src/lib.rs, [[bin]]
# src/main.rs and the two [[bench]] files (cargo rejects a manifest whose target files are
# missing, even when it does not build them). Keep this list in step with Cargo.toml. The
# development kit (devkit/, the workspace's second member) is never built into the image, but
# its manifest and stub targets must exist for cargo to load the workspace.
COPY Cargo.toml Cargo.lock ./
COPY devkit/Cargo.toml ./devkit/Cargo.toml
RUN mkdir -p src benches devkit/src \
    && echo 'fn main() {}' > src/main.rs \
    && touch src/lib.rs \
    && echo 'fn main() {}' > benches/decode.rs \
    && echo 'fn main() {}' > benches/offset_window.rs \
    && echo 'fn main() {}' > devkit/src/main.rs \
    && touch devkit/src/lib.rs \
    && cargo build --release --locked -p history-service \
    && rm -rf src

# The real sources. Besides src/, the crate embeds config/default.toml (include_str!) and the
# SQL in migrations/ (refinery::embed_migrations!) at compile time, so both must be here.
COPY src ./src
COPY config ./config
COPY migrations ./migrations
# COPY keeps the files' own modification times, which may be older than the stub build's
# artifacts; touch them so cargo rebuilds the crate itself (dependencies stay cached).
RUN touch src/main.rs src/lib.rs \
    && cargo build --release --locked -p history-service \
    && cp target/release/history-service /usr/local/bin/history-service

# --------------------------------------------------------------------------------------------
# Runtime
# --------------------------------------------------------------------------------------------
FROM debian:bookworm-slim AS runtime

# Shared libraries the binary loads besides glibc and libgcc_s (both in the base image):
#   - zlib1g: libz.so.1 (librdkafka compression; already in the base image, listed for clarity);
#   - libssl3: libssl.so.3/libcrypto.so.3 (Kafka SSL/SASL_SSL, PostgreSQL TLS);
#   - ca-certificates: the trust store OpenSSL verifies broker and database certificates with.
# Check with `ldd /usr/local/bin/history-service` after a change of features.
RUN apt-get update \
    && apt-get install -y --no-install-recommends zlib1g libssl3 ca-certificates \
    && rm -rf /var/lib/apt/lists/*

# An unprivileged user with a fixed numeric id, so Kubernetes' runAsNonRoot can verify it.
# The service writes nothing to disk (the root filesystem can be read-only).
RUN groupadd --system --gid 10001 history \
    && useradd --system --uid 10001 --gid history --no-create-home \
        --home-dir /nonexistent --shell /usr/sbin/nologin history

COPY --from=builder /usr/local/bin/history-service /usr/local/bin/history-service

USER 10001:10001

# /metrics, /healthz and /readyz. The built-in default binds 127.0.0.1, which nothing outside
# the container can reach (probes, Prometheus); bind every interface instead. Environment
# variables override the --config file, so change the port here (or with -e/env), not in a file.
ENV HISTORY__HTTP__LISTEN=0.0.0.0:9464
EXPOSE 9464

# The binary runs as PID 1 and handles SIGTERM itself (stop fetching, drain in-flight work for
# up to pipeline.shutdown_timeout_ms, commit offsets, leave the consumer group), so no init
# wrapper is needed. No HEALTHCHECK: the image has no HTTP client; orchestrators probe /healthz
# and /readyz.
ENTRYPOINT ["history-service"]
CMD ["run"]

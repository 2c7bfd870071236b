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

# rdkafka-sys compiles the librdkafka bundled in the crate with librdkafka's own mklove
# `./configure` (a bash script) and `make libs` (C and C++: gcc, g++, make), with every codec
# and authentication mechanism built in and linked statically (Cargo.toml):
#   - zstd (zstd-sys), zlib (libz-sys, `libz-static`), snappy and lz4 (in librdkafka itself);
#   - Cyrus SASL and MIT Kerberos for GSSAPI (sasl2-sys and krb5-src, `gssapi-vendored`), built
#     from the crates' sources with their configure scripts: perl besides;
#   - libcurl for OAUTHBEARER/OIDC (curl-sys, `curl-static`), built with cc. librdkafka's
#     configure turns its OIDC client on only if pkg-config finds a libcurl, hence
#     libcurl4-openssl-dev here; the binary links curl-sys's static one (no libcurl.so).
# pkg-config and libssl-dev: rdkafka's `ssl` feature, libcurl and the
# `openssl`/`postgres-openssl` crates link the system OpenSSL 3 through openssl-sys
# (libssl.so.3/libcrypto.so.3 at run time). tikv-jemalloc-sys (the
# binary's allocator) builds the jemalloc bundled in the crate with its configure script:
# linked statically. The rust:*-bookworm image (buildpack-deps) already ships most of these;
# they are listed so the requirement is explicit and the stage still works on a slimmer base.
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        gcc g++ make perl pkg-config libssl-dev libcurl4-openssl-dev \
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

# The shared libraries the binary loads besides glibc's (libc, libm, libresolv: libc6) and
# libgcc_s (libgcc-s1), both in the base image — tests/it/image.rs checks this list against
# `ldd` of the built binary:
#   - libssl3: libssl.so.3/libcrypto.so.3 (Kafka SSL/SASL_SSL and SCRAM, PostgreSQL TLS, the
#     OIDC token requests);
# and what librdkafka runs or reads:
#   - krb5-user: `kinit`, which librdkafka runs to log in from the keytab under GSSAPI
#     (sasl.kerberos.kinit.cmd; Kerberos itself is linked in);
#   - ca-certificates: the trust store OpenSSL verifies brokers, databases and identity
#     providers with.
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libssl3 krb5-user ca-certificates \
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

#!/usr/bin/env bash
# What building the service needs beyond Rust and a C toolchain: librdkafka's configure turns
# its OIDC client (OAUTHBEARER with sasl.oauthbearer.method=oidc) on only if pkg-config finds a
# libcurl, so Debian's libcurl4-openssl-dev must be there when rdkafka-sys first builds (the
# binary links curl-sys's static libcurl, not this one). Installs it when missing; fails
# loudly if it cannot. Built without it, the service lacks OIDC and its features test says so.
set -euo pipefail

if pkg-config --exists libcurl 2>/dev/null; then
  exit 0
fi
echo "installing libcurl4-openssl-dev (Debian) for librdkafka's OIDC client"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq libcurl4-openssl-dev pkg-config
pkg-config --exists libcurl

#!/usr/bin/env bash
# The external programs the tests drive as a user would: kcat (a real Kafka client) and
# Prometheus with promtool (the alert rules, a real scrape). Installs Debian's packages when one
# is missing; a test whose tool is missing fails, so a machine where this cannot install them
# fails loudly rather than passing without checking.
set -euo pipefail

missing=()
command -v kcat >/dev/null 2>&1 || missing+=(kcat)
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  missing+=(prometheus)
fi
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (Debian packages) for the tests"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${missing[@]}"
  # The package's own service is not wanted: the tests start their own server.
  if command -v systemctl >/dev/null 2>&1; then $sudo systemctl stop prometheus 2>/dev/null || true; fi
fi
kcat -V | head -n 1
promtool --version | head -n 1

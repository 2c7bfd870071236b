#!/usr/bin/env bash
# The external programs the tests drive as a user would, installed when missing:
#   - kcat and the confluent-kafka Python client (Debian's python3-confluent-kafka): real Kafka
#     clients of their own, producing every compression codec;
#   - Prometheus with promtool: the alert rules, a real scrape;
#   - an MIT Kerberos KDC (krb5-kdc, krb5-admin-server) and kinit (krb5-user): GSSAPI;
#   - oauth2-mock-server (npm, into target/test-tools): an OpenID Connect provider, for
#     OAUTHBEARER with OIDC;
#   - tansu (cargo install; about 25 minutes the first time): a Kafka-protocol broker that
#     checks SCRAM credentials; socat and openssl put TLS in front of it.
# A test whose tool is missing fails, so a machine where this cannot install them fails loudly
# rather than passing without checking.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=()
command -v kcat >/dev/null 2>&1 || packages+=(kcat)
if ! command -v promtool >/dev/null 2>&1 || ! command -v prometheus >/dev/null 2>&1; then
  packages+=(prometheus)
fi
/usr/bin/python3 -c "import confluent_kafka" >/dev/null 2>&1 || packages+=(python3-confluent-kafka)
[ -x /usr/sbin/krb5kdc ] || packages+=(krb5-kdc)
[ -x /usr/sbin/kadmin.local ] || packages+=(krb5-admin-server)
command -v kinit >/dev/null 2>&1 || packages+=(krb5-user)
command -v socat >/dev/null 2>&1 || packages+=(socat)
command -v openssl >/dev/null 2>&1 || packages+=(openssl)
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
if [ "${#packages[@]}" -gt 0 ]; then
  echo "installing ${packages[*]} (Debian packages) for the tests"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq "${packages[@]}"
  # The packages' own services are not wanted: the tests start their own servers.
  if command -v systemctl >/dev/null 2>&1; then
    $sudo systemctl stop prometheus krb5-kdc krb5-admin-server 2>/dev/null || true
  fi
fi

# The OpenID Connect provider: 8.2 is the last release that runs on Node.js 20.
oidc_version=8.2.3
if ! grep -qs "\"version\": \"$oidc_version\"" target/test-tools/node_modules/oauth2-mock-server/package.json; then
  echo "installing oauth2-mock-server@$oidc_version (npm) into target/test-tools"
  mkdir -p target/test-tools
  npm install --prefix target/test-tools --no-audit --no-fund --loglevel=error \
    "oauth2-mock-server@$oidc_version"
fi

# tansu, with the SQLite store its authenticated runs keep users in.
tansu_version=0.6.0
tansu="$(command -v tansu || echo "$HOME/.cargo/bin/tansu")"
# (The output is read whole: `grep -q` would end the pipe early, which pipefail counts as a
# failure.)
tansu_ok=false
if [ -x "$tansu" ]; then
  help=$("$tansu" broker --help 2>/dev/null || true)
  if [[ "$help" == *--authentication* ]] && grep -c libsql "$tansu" >/dev/null 2>&1; then
    tansu_ok=true
  fi
fi
if [ "$tansu_ok" != true ]; then
  echo "installing tansu $tansu_version (cargo install; this takes a while the first time)"
  cargo install --locked --force tansu --version "$tansu_version" --features dynostore,libsql
  tansu="$HOME/.cargo/bin/tansu"
fi

kcat -V | head -n 1
promtool --version | head -n 1
/usr/bin/python3 -c "import confluent_kafka; print('confluent-kafka', confluent_kafka.version()[0], 'librdkafka', confluent_kafka.libversion()[0])"
command -v kinit krb5kdc
node --version
"$tansu" --version 2>/dev/null || echo "tansu installed"

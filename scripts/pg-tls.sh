#!/usr/bin/env bash
# The local PostgreSQL over TLS with a test CA, for the connectivity tests
# (tests/it/store/tls.rs): the server keeps `ssl = on` and shows a certificate signed by
# a test CA instead of its own (Debian's snakeoil). Plaintext and sslmode=prefer clients
# are unaffected: nothing else about the server changes.
#
# The certificate names only `localhost` (not 127.0.0.1), so connecting to 127.0.0.1
# with verify-full is the wrong-name case, against the same server. `other-ca.pem` is a
# CA that signed nothing the server shows (the untrusted case).
#
# The server's copy of the certificate and key goes into its data directory (owned by the
# postgres OS user, key 0600): the cache below may sit in a home the server cannot read.
# Needs a local server and root (or the postgres OS user) to write there.
#
#   scripts/pg-tls.sh start | stop
# `stop` points the server back at the certificate it had before (ALTER SYSTEM RESET).
# Idempotent.
#
# Environment:
#   PUSHPACE_PG_URL     server (default postgres://postgres@127.0.0.1:5432)
#   PUSHPACE_TOOLS_DIR  cache  (default $HOME/.cache/pushpace); files in pg-tls/
set -euo pipefail

PG_URL=${PUSHPACE_PG_URL:-postgres://postgres@127.0.0.1:5432}
TOOLS=${PUSHPACE_TOOLS_DIR:-$HOME/.cache/pushpace}
DIR="$TOOLS/pg-tls"
# Relative to the data directory, as the server reads ssl_cert_file.
CERT_NAME=pushpace-test-server.pem
KEY_NAME=pushpace-test-server.key

log() { printf '[pg-tls] %s\n' "$*" >&2; }
sql() { psql "$PG_URL/postgres" -v ON_ERROR_STOP=1 -qtAc "$1"; }

ensure_certs() {
  [ -f "$DIR/server.pem" ] && [ -f "$DIR/other-ca.pem" ] && return
  log "making the test CA and certificates in $DIR"
  mkdir -p "$DIR"
  (
    cd "$DIR"
    for ca in ca other-ca; do
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pushpace postgres $ca" \
        -keyout "$ca.key" -out "$ca.pem" 2>/dev/null
    done
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    chmod 600 ./*.key
  )
}

# Whether the server shows the test certificate: libpq verifies it against the test CA.
serves_test_cert() {
  psql "host=localhost port=${PG_PORT} user=postgres dbname=postgres sslmode=verify-full sslrootcert=$DIR/ca.pem" \
    -qtAc 'select ssl from pg_stat_ssl where pid = pg_backend_pid()' 2>/dev/null | grep -q t
}

start() {
  ensure_certs
  local data
  data=$(sql 'show data_directory')
  [ -d "$data" ] || { log "the server's data directory $data is not on this machine"; exit 1; }
  if ! cmp -s "$DIR/server.pem" "$data/$CERT_NAME" || ! cmp -s "$DIR/server.key" "$data/$KEY_NAME"; then
    install -o postgres -g postgres -m 0644 "$DIR/server.pem" "$data/$CERT_NAME"
    install -o postgres -g postgres -m 0600 "$DIR/server.key" "$data/$KEY_NAME"
  fi
  if [ "$(sql 'show ssl_cert_file')" != "$CERT_NAME" ] || [ "$(sql 'show ssl_key_file')" != "$KEY_NAME" ] \
    || [ "$(sql 'show ssl')" != on ] || ! serves_test_cert; then
    log "pointing the server at the test certificate ($data/$CERT_NAME)"
    sql "ALTER SYSTEM SET ssl = on" >/dev/null
    sql "ALTER SYSTEM SET ssl_cert_file = '$CERT_NAME'" >/dev/null
    sql "ALTER SYSTEM SET ssl_key_file = '$KEY_NAME'" >/dev/null
    sql 'SELECT pg_reload_conf()' >/dev/null
    for _ in $(seq 1 20); do serves_test_cert && break; sleep 0.25; done
  fi
  serves_test_cert || {
    log "the server does not show the test certificate; see its log (a key it cannot read?)"
    exit 1
  }
  log "PostgreSQL serves the test certificate (CA: $DIR/ca.pem, name: localhost)"
}

stop() {
  if [ "$(sql 'show ssl_cert_file')" = "$CERT_NAME" ]; then
    sql 'ALTER SYSTEM RESET ssl_cert_file' >/dev/null
    sql 'ALTER SYSTEM RESET ssl_key_file' >/dev/null
    sql 'SELECT pg_reload_conf()' >/dev/null
    log "the server shows its own certificate again"
  fi
}

PG_PORT=$(printf '%s' "$PG_URL" | sed -E 's#.*:([0-9]+)/?$#\1#')
case "$PG_PORT" in ''|*[!0-9]*) PG_PORT=5432 ;; esac

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

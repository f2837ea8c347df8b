#!/usr/bin/env bash
# A second redis-server, over TLS only, for the Redis connectivity tests
# (tests/it/distributed/tls.rs): 127.0.0.1:6380 under the name `localhost`, with a test
# CA, an ACL user and the default user disabled, so that nothing unauthenticated
# passes. Client certificates are optional (mutual TLS works, plain TLS too). The
# plaintext Redis on 6379 is left alone.
#
# The certificate names only `localhost` (not 127.0.0.1), so connecting to 127.0.0.1 is
# the wrong-name case. `other-ca.pem` is a CA that signed nothing the server shows.
#
# Idempotent. `scripts/redis-tls.sh stop` stops the server this script started (pid file).
#
# Environment:
#   PUSHPACE_TOOLS_DIR       cache (default $HOME/.cache/pushpace); files in redis-tls/
#   PUSHPACE_REDIS_TLS_PORT  port  (default 6380)
set -euo pipefail

TOOLS=${PUSHPACE_TOOLS_DIR:-$HOME/.cache/pushpace}
DIR="$TOOLS/redis-tls"
PORT=${PUSHPACE_REDIS_TLS_PORT:-6380}
USER_NAME=pushpace
PASSWORD=pushpace-redis-test-password

log() { printf '[redis-tls] %s\n' "$*" >&2; }

ensure_certs() {
  [ -f "$DIR/client.pem" ] && return
  log "making the test CA and certificates in $DIR"
  mkdir -p "$DIR"
  (
    cd "$DIR"
    for ca in ca other-ca; do
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pushpace redis $ca" \
        -keyout "$ca.key" -out "$ca.pem" 2>/dev/null
    done
    openssl req -newkey rsa:2048 -nodes -subj "/CN=localhost" \
      -keyout server.key -out server.csr 2>/dev/null
    printf 'subjectAltName=DNS:localhost\nextendedKeyUsage=serverAuth\n' >server.ext
    openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile server.ext -out server.pem 2>/dev/null
    openssl req -newkey rsa:2048 -nodes -subj "/CN=pushpace-client" \
      -keyout client.key -out client.csr 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >client.ext
    openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
      -extfile client.ext -out client.pem 2>/dev/null
    printf '%s\n' "$PASSWORD" >redis.password
    chmod 600 ./*.key redis.password
  )
}

up() {
  redis-cli --tls --cacert "$DIR/ca.pem" -h localhost -p "$PORT" \
    --user "$USER_NAME" --pass "$PASSWORD" --no-auth-warning ping 2>/dev/null | grep -q PONG
}

start() {
  command -v redis-server >/dev/null 2>&1 || {
    log "installing Debian's redis-server with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  }
  ensure_certs
  if up; then log "Redis over TLS answers at localhost:$PORT"; return; fi
  log "starting redis-server over TLS on 127.0.0.1:$PORT"
  redis-server --daemonize yes --port 0 --tls-port "$PORT" --bind 127.0.0.1 \
    --tls-cert-file "$DIR/server.pem" --tls-key-file "$DIR/server.key" \
    --tls-ca-cert-file "$DIR/ca.pem" --tls-auth-clients optional \
    --user "$USER_NAME" on ">$PASSWORD" '~*' '&*' '+@all' --user default off \
    --save "" --appendonly no --dir "$DIR" \
    --pidfile "$DIR/redis.pid" --logfile "$DIR/redis.log"
  for _ in $(seq 1 30); do up && break; sleep 0.3; done
  up || { log "Redis over TLS does not answer on localhost:$PORT; see $DIR/redis.log"; exit 1; }
  log "Redis over TLS answers at localhost:$PORT (user $USER_NAME)"
}

stop() {
  local pidf="$DIR/redis.pid"
  [ -f "$pidf" ] || return 0
  local pid
  pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    log "stopped redis-server over TLS (pid $pid)"
  fi
  rm -f "$pidf"
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  *) echo "usage: $0 [start|stop]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# Kafka over TLS for the connectivity tests, on loopback only, idempotent:
#   127.0.0.1:9093  SASL_SSL  (tansu --authentication: PLAIN and SCRAM users; TLS by stunnel)
#   127.0.0.1:9094  SSL with client certificates required (mutual TLS, by stunnel)
# tansu 0.6.0 takes --cert/--key but never wraps its connections in TLS (tansu-broker's
# broker.rs builds `_acceptor` and serves the raw stream; docs/RELIABILITY.md), so
# Debian's stunnel terminates TLS in front of two tansu brokers that listen in plaintext
# on 127.0.0.1:9095 and :9096 and advertise the TLS ports under the name `localhost`
# (the server certificate's only name). Certificates: a test CA, the server's, a
# client's, and a second CA that signs nothing of ours (the "untrusted" case).
#
#   scripts/kafka-secure.sh start | stop | env
# `env` prints the variables the tests read (PUSHPACE_TEST_KAFKA_TLS_DIR, users).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)
PG_URL=${PUSHPACE_PG_URL:-postgres://postgres@127.0.0.1:5432}
TOOLS=${PUSHPACE_TOOLS_DIR:-$HOME/.cache/pushpace}
TANSU_BIN="$TOOLS/tansu-0.6.0/bin/tansu"
SCHEMA=${TANSU_PG_SCHEMA:-$ROOT/../shared/tansu/postgres-schema-v0.6.0.sql}
CERTS="$TOOLS/kafka-tls"
RUN_DIR="$ROOT/target/services"
SCRAM_USER=pushpace
SCRAM_PASSWORD=pushpace-scram-test-password

log() { printf '[kafka-secure] %s\n' "$*" >&2; }
answers() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

ensure_stunnel() {
  command -v stunnel >/dev/null 2>&1 && return
  log "installing Debian's stunnel4 with apt"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq stunnel4 >/dev/null
}

ensure_certs() {
  [ -f "$CERTS/client.pem" ] && return
  log "making the test CA and certificates in $CERTS"
  mkdir -p "$CERTS"
  (
    cd "$CERTS"
    for ca in ca other-ca; do
      openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj "/CN=pushpace $ca" \
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
    printf '%s\n' "$SCRAM_PASSWORD" >scram.password
    chmod 600 ./*.key scram.password
  )
}

ensure_db() {
  local db=$1
  if [ "$(psql "$PG_URL/postgres" -tAc "select 1 from pg_database where datname='$db'")" != 1 ]; then
    psql "$PG_URL/postgres" -qc "create database $db" >/dev/null
  fi
  if [ "$(psql "$PG_URL/$db" -tAc "select to_regclass('public.record') is not null")" != t ]; then
    psql "$PG_URL/$db" -v ON_ERROR_STOP=1 -qf "$SCHEMA" >/dev/null
  fi
}

# start_tansu NAME PLAIN_PORT TLS_PORT DB [--authentication]
start_tansu() {
  local name=$1 port=$2 tls_port=$3 db=$4; shift 4
  local pidf="$RUN_DIR/tansu-$name.pid"
  if answers "$port"; then return; fi
  nohup "$TANSU_BIN" broker \
    --listener-url "tcp://127.0.0.1:$port" \
    --advertised-listener-url "tcp://localhost:$tls_port" \
    --storage-engine "$PG_URL/$db?sslmode=disable" "$@" \
    >>"$RUN_DIR/tansu-$name.log" 2>&1 </dev/null &
  echo $! >"$pidf"
  for _ in $(seq 1 60); do answers "$port" && return; sleep 0.5; done
  log "tansu $name did not start; see target/services/tansu-$name.log"; exit 1
}

stop_pid() {
  local pidf=$1
  [ -f "$pidf" ] || return 0
  local pid; pid=$(cat "$pidf")
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"; for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  rm -f "$pidf"
}

ensure_stunnel_running() {
  local pidf="$RUN_DIR/stunnel.pid"
  # Already up (this script's, or one another checkout started): use it.
  if answers 9093 && answers 9094; then return; fi
  cat >"$RUN_DIR/stunnel.conf" <<EOF
foreground = no
pid = $pidf
output = $RUN_DIR/stunnel.log
[kafka-sasl-ssl]
accept = 127.0.0.1:9093
connect = 127.0.0.1:9095
cert = $CERTS/server.pem
key = $CERTS/server.key
[kafka-mtls]
accept = 127.0.0.1:9094
connect = 127.0.0.1:9096
cert = $CERTS/server.pem
key = $CERTS/server.key
CAfile = $CERTS/ca.pem
verifyChain = yes
requireCert = yes
EOF
  stunnel "$RUN_DIR/stunnel.conf"
  for _ in $(seq 1 40); do answers 9093 && answers 9094 && return; sleep 0.25; done
  log "stunnel did not start; see target/services/stunnel.log"; exit 1
}

scram_users() {
  psql "$PG_URL/tansu_sasl" -tAc "select count(*) from scram_credential" 2>/dev/null || echo 0
}

# SCRAM credentials live in tansu's storage; they are written through the Kafka API
# (AlterUserScramCredentials) while the broker does not yet require authentication.
ensure_scram_users() {
  [ "$(scram_users)" -ge 2 ] 2>/dev/null && return
  log "creating the SCRAM users (SHA-256 and SHA-512) in tansu_sasl"
  stop_pid "$RUN_DIR/tansu-sasl.pid"
  start_tansu sasl 9095 9093 tansu_sasl
  python3 "$ROOT/scripts/kafka-scram-users.py" "$CERTS/ca.pem" "$SCRAM_USER" "$SCRAM_PASSWORD"
  stop_pid "$RUN_DIR/tansu-sasl.pid"
}

case "${1:-start}" in
  start)
    mkdir -p "$RUN_DIR"
    [ -x "$TANSU_BIN" ] || { log "tansu is not installed: run scripts/services.sh first"; exit 1; }
    ensure_stunnel
    ensure_certs
    ensure_db tansu_sasl
    ensure_db tansu_mtls
    ensure_stunnel_running
    ensure_scram_users
    start_tansu sasl 9095 9093 tansu_sasl --authentication
    start_tansu mtls 9096 9094 tansu_mtls
    log "SASL_SSL on 127.0.0.1:9093, mutual TLS on 127.0.0.1:9094 (name: localhost)"
    ;;
  stop)
    stop_pid "$RUN_DIR/tansu-sasl.pid"; stop_pid "$RUN_DIR/tansu-mtls.pid"
    stop_pid "$RUN_DIR/stunnel.pid"
    ;;
  env)
    echo "PUSHPACE_TEST_KAFKA_TLS_DIR=$CERTS"
    echo "PUSHPACE_TEST_KAFKA_SCRAM_USER=$SCRAM_USER"
    ;;
  *) echo "usage: $0 [start|stop|env]" >&2; exit 2 ;;
esac

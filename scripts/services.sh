#!/usr/bin/env bash
# Makes sure the services pushpace's tests and local runs need are up, on loopback only:
# PostgreSQL, the tansu Kafka-protocol broker (PostgreSQL storage engine) and the jobs topic;
# and Debian's chromium for the dashboard's browser test.
# Idempotent. `scripts/services.sh stop` stops what this script started (by pid file).
#
# Environment:
#   PUSHPACE_PG_URL       server to use      (default postgres://postgres@127.0.0.1:5432)
#   PUSHPACE_TOOLS_DIR    install cache      (default $HOME/.cache/pushpace)
#   TANSU_PG_SCHEMA       tansu's schema SQL (default ../shared/tansu/postgres-schema-v0.6.0.sql)
#   PUSHPACE_KAFKA_PORT   broker port        (default 9092)
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
PG_URL=${PUSHPACE_PG_URL:-postgres://postgres@127.0.0.1:5432}
TOOLS=${PUSHPACE_TOOLS_DIR:-$HOME/.cache/pushpace}
TANSU_VERSION=0.6.0
TANSU_BIN="$TOOLS/tansu-$TANSU_VERSION/bin/tansu"
KAFKA_PORT=${PUSHPACE_KAFKA_PORT:-9092}
KAFKA_URL="tcp://127.0.0.1:$KAFKA_PORT"
RUN_DIR="$ROOT/target/services"
TOPIC=${PUSHPACE_TOPIC:-pushpace.jobs}
SCHEMA=${TANSU_PG_SCHEMA:-$ROOT/../shared/tansu/postgres-schema-v$TANSU_VERSION.sql}

log() { printf '[services] %s\n' "$*" >&2; }

pg_up() { psql "$PG_URL/postgres" -tAc 'select 1' >/dev/null 2>&1; }

ensure_postgres() {
  if pg_up; then log "PostgreSQL answers at ${PG_URL#*@}"; return; fi
  log "PostgreSQL does not answer; starting it"
  if ! command -v pg_ctlcluster >/dev/null 2>&1; then
    log "installing PostgreSQL with apt"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq postgresql >/dev/null
  fi
  local ver
  ver=$(ls /etc/postgresql | sort -V | tail -1)
  local hba="/etc/postgresql/$ver/main/pg_hba.conf"
  # Tests connect as postgres over TCP without a password, as on the project's machines.
  if ! grep -q '^host all postgres 127.0.0.1/32 trust' "$hba"; then
    sed -i '1i host all postgres 127.0.0.1/32 trust' "$hba"
  fi
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start || pg_ctlcluster "$ver" main start
  for _ in $(seq 1 30); do pg_up && break; sleep 1; done
  pg_up || { log "PostgreSQL still does not answer at ${PG_URL#*@}"; exit 1; }
}

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }

# Redis backs the distributed mode and its tests; the project's machines run one already.
ensure_redis() {
  if redis_up; then log "Redis answers at 127.0.0.1:6379"; return; fi
  log "Redis does not answer; starting it"
  if ! command -v redis-server >/dev/null 2>&1; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq && apt-get install -y -qq redis-server >/dev/null
  fi
  mkdir -p /var/lib/redis /var/log/redis
  redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
    --dir /var/lib/redis --logfile /var/log/redis/ci.log
  for _ in $(seq 1 30); do redis_up && break; sleep 0.5; done
  redis_up || { log "Redis still does not answer on 127.0.0.1:6379"; exit 1; }
}

ensure_tansu_db() {
  if [ "$(psql "$PG_URL/postgres" -tAc "select 1 from pg_database where datname='tansu'")" != 1 ]; then
    psql "$PG_URL/postgres" -qc 'create database tansu' >/dev/null
  fi
  if [ "$(psql "$PG_URL/tansu" -tAc "select to_regclass('public.record') is not null")" != t ]; then
    [ -f "$SCHEMA" ] || {
      log "tansu's schema not found at $SCHEMA."
      log "Get etc/initdb.d/010-schema.sql from tansu's repository at v$TANSU_VERSION and set TANSU_PG_SCHEMA,"
      log "or point pushpace at any Kafka broker with PUSHPACE__KAFKA__BROKERS."
      exit 1
    }
    log "loading tansu's schema into database tansu"
    psql "$PG_URL/tansu" -v ON_ERROR_STOP=1 -qf "$SCHEMA" >/dev/null
  fi
}

ensure_tansu_installed() {
  if [ -x "$TANSU_BIN" ] && "$TANSU_BIN" --version 2>/dev/null | grep -q "tansu $TANSU_VERSION"; then
    return
  fi
  log "installing tansu $TANSU_VERSION into $TOOLS (about 20 minutes on 2 cores)"
  mkdir -p "$TOOLS"
  CARGO_TARGET_DIR="$TOOLS/tansu-build" cargo install "tansu@$TANSU_VERSION" --locked \
    --features dynostore,postgres --root "$TOOLS/tansu-$TANSU_VERSION" >"$TOOLS/tansu-install.log" 2>&1 || {
    tail -20 "$TOOLS/tansu-install.log" >&2; exit 1; }
  rm -rf "$TOOLS/tansu-build"
}

# librdkafka is built with TLS and SASL against the system's OpenSSL.
ensure_build_deps() {
  if pkg-config --exists openssl 2>/dev/null; then return; fi
  log "installing libssl-dev with apt (librdkafka's TLS and SASL)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq libssl-dev pkg-config >/dev/null
}

# Third-party peers the tests drive: confluent-kafka (SCRAM users; producers with each
# codec), hypercorn (an HTTP/2 server), http_ece (Web Push decryption).
ensure_python_peers() {
  if python3 -c 'import confluent_kafka, hypercorn, http_ece' 2>/dev/null; then return; fi
  log "installing the Python test peers with pip"
  python3 -m pip install -q confluent-kafka hypercorn http_ece >/dev/null
}

# The dashboard's browser test drives Debian's headless Chromium.
ensure_chromium() {
  if [ -x /usr/bin/chromium ]; then return; fi
  log "installing Debian's chromium with apt (for the dashboard's browser test)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq chromium >/dev/null || {
    log "could not install chromium: the browser test will fail"; exit 1; }
}

broker_answers() { (exec 3<>"/dev/tcp/127.0.0.1/$KAFKA_PORT") 2>/dev/null; }

create_topic() {
  local out
  for _ in $(seq 1 30); do
    if out=$("$TANSU_BIN" topic create "$1" --partitions "$2" --broker "$KAFKA_URL" 2>&1); then
      log "created topic $1 ($2 partitions)"; return
    fi
    case "$out" in *TopicAlreadyExists*|*"already exists"*) return ;; esac
    sleep 1
  done
  log "could not create topic $1: $out"; exit 1
}

ensure_broker() {
  mkdir -p "$RUN_DIR"
  local pidf="$RUN_DIR/tansu.pid"
  if [ -f "$pidf" ] && kill -0 "$(cat "$pidf")" 2>/dev/null && broker_answers; then
    log "tansu already runs (pid $(cat "$pidf")) on 127.0.0.1:$KAFKA_PORT"
  elif broker_answers; then
    log "a broker already answers on 127.0.0.1:$KAFKA_PORT (not started by this script); using it"
  else
    log "starting tansu on 127.0.0.1:$KAFKA_PORT (log: target/services/tansu.log)"
    nohup "$TANSU_BIN" broker \
      --listener-url "$KAFKA_URL" --advertised-listener-url "$KAFKA_URL" \
      --storage-engine "$PG_URL/tansu?sslmode=disable" >>"$RUN_DIR/tansu.log" 2>&1 </dev/null &
    echo $! >"$pidf"
    for _ in $(seq 1 60); do broker_answers && break; sleep 0.5; done
    broker_answers || { log "tansu did not start; see target/services/tansu.log"; tail -20 "$RUN_DIR/tansu.log" >&2; exit 1; }
  fi
  create_topic "$TOPIC" 8
}

stop_all() {
  local pidf="$RUN_DIR/tansu.pid"
  if [ -f "$pidf" ]; then
    local pid; pid=$(cat "$pidf")
    if kill -0 "$pid" 2>/dev/null; then
      kill "$pid"; for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
      kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
      log "stopped tansu (pid $pid)"
    fi
    rm -f "$pidf"
  fi
}

case "${1:-start}" in
  start)
    ensure_build_deps
    ensure_postgres
    ensure_redis
    ensure_tansu_db
    ensure_tansu_installed
    ensure_broker
    # Kafka over SASL_SSL and mutual TLS for the connectivity tests (tests/it/kafka_secure.rs).
    ensure_python_peers
    "$ROOT/scripts/kafka-secure.sh" start
    "$ROOT/scripts/redis-tls.sh" start  # Redis over TLS + ACL (tests/it/distributed/tls.rs)
    "$ROOT/scripts/pg-tls.sh" start     # PostgreSQL's test certificate (tests/it/store/tls.rs)
    ensure_chromium
    echo "PUSHPACE_TANSU_BIN=$TANSU_BIN"
    ;;
  postgres) ensure_build_deps; ensure_postgres ;;
  stop)
    stop_all
    "$ROOT/scripts/kafka-secure.sh" stop
    "$ROOT/scripts/redis-tls.sh" stop
    "$ROOT/scripts/pg-tls.sh" stop
    ;;
  restart-broker) stop_all; ensure_broker ;;
  *) echo "usage: $0 [start|postgres|stop|restart-broker]" >&2; exit 2 ;;
esac

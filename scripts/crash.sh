#!/usr/bin/env bash
# Crash suite (kill -9): a workload of CAMPAIGNS campaigns and CAMPAIGNS × DEVICES devices
# against a loopback sink; the worker is killed with SIGKILL at KILLS random moments and
# restarted each time. Fails (exit 1) when a device is lost, when the duplicates exceed
# their bound, or when delivery_seconds does not reconcile with the sink. Loopback only;
# stops by itself.
#
# The duplicate bound. A kill loses the progress not yet flushed: what was sent since the
# last flush, at most R × (F + M), and the sends in flight, at most I. Each is sent again
# after the restart. R is the summed send rate of the campaigns (CAMPAIGNS × RATE, /s),
# F the stats flush interval (worker.stats_flush_ms), M a margin for the flush's own
# duration (FLUSH_MARGIN_MS), I sender.max_in_flight. Per crash: R × (F + M) + I; in all:
# kills × that.
#
# Environment: KILLS (10), CAMPAIGNS (10), DEVICES (20000), RATE (500), SINK_PORT (18090),
# FLUSH_MS (1000), FLUSH_MARGIN_MS (500), IN_FLIGHT (512), PROFILE (release | debug),
# CARGO_TARGET_DIR (where the build goes; default target).
set -euo pipefail
cd "$(dirname "$0")/.."

KILLS=${KILLS:-10}
CAMPAIGNS=${CAMPAIGNS:-10}
DEVICES=${DEVICES:-20000}  # 10 × 20,000 = 200,000 devices
RATE=${RATE:-500}
SINK_PORT=${SINK_PORT:-18090}
FLUSH_MS=${FLUSH_MS:-1000}
FLUSH_MARGIN_MS=${FLUSH_MARGIN_MS:-500}
IN_FLIGHT=${IN_FLIGHT:-512}
PROFILE=${PROFILE:-release}
# How long a restarted worker may take to deliver again: the group drops the killed
# member after its session timeout (6 s), then rebalances.
RESTART_LIMIT_S=60

pg_up() { psql postgres://postgres@127.0.0.1:5432/postgres -tAc 'select 1' >/dev/null 2>&1; }
broker_up() { (exec 3<>/dev/tcp/127.0.0.1/9092) 2>/dev/null; }
if ! pg_up || ! broker_up; then
  scripts/services.sh start >/dev/null
fi
TARGET=${CARGO_TARGET_DIR:-target}
if [ "$PROFILE" = release ]; then
  cargo build --release -q --bin pushpace
else
  cargo build -q --bin pushpace
fi
BIN=$TARGET/$PROFILE/pushpace
RUN=$(date +%s)
DB=postgres://postgres@127.0.0.1:5432/pushpace_crash_$RUN
export PUSHPACE__KAFKA__BROKERS=127.0.0.1:9092
export PUSHPACE__KAFKA__TOPIC=crash-$RUN
export PUSHPACE__KAFKA__GROUP_ID=crash-$RUN
export PUSHPACE__DATABASE__URL=$DB
export PUSHPACE__SENDER__URL=http://127.0.0.1:$SINK_PORT/push
export PUSHPACE__HTTP__BIND=127.0.0.1:0
# The values the bound is computed from, passed to the worker explicitly.
export PUSHPACE__WORKER__STATS_FLUSH_MS=$FLUSH_MS
export PUSHPACE__SENDER__MAX_IN_FLIGHT=$IN_FLIGHT
export RUST_LOG=warn
LOG=$TARGET/crash-$RUN.log

$BIN migrate >/dev/null
$BIN sink --bind 127.0.0.1:$SINK_PORT >/dev/null 2>>"$LOG" &
SINK=$!
WORKER=
cleanup() { [ -n "$WORKER" ] && kill -9 "$WORKER" 2>/dev/null; kill "$SINK" 2>/dev/null || true; }
trap cleanup EXIT
$BIN produce --campaigns "$CAMPAIGNS" --devices-per-campaign "$DEVICES" --send-rate "$RATE" \
  --prefix "crash$RUN" >/dev/null 2>>"$LOG"
TOTAL=$((CAMPAIGNS * DEVICES))

# distinct duplicates delivered
sink_stats() {
  python3 - "$SINK_PORT" <<'PY'
import json, sys, urllib.request
d = json.load(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/_sink/stats"))
print(d["distinct_delivered"], d["duplicates"], d["delivered"])
PY
}

start_worker() { $BIN run >/dev/null 2>>"$LOG" & WORKER=$!; }

fail() { echo "FAIL: $*"; exit 1; }

max_dup=0
prev_dup=0
kills=0
printf '%-6s %-14s %-12s %-10s\n' kill sending_for_s delivered new_dups
for i in $(seq 1 "$KILLS"); do
  start_worker
  # Kill at a random moment while it sends: wait for its first deliveries first (a
  # restarted member waits for the group to drop the killed one, about 6 s).
  read -r before _ _ < <(sink_stats)
  sending=
  for _ in $(seq 1 $((RESTART_LIMIT_S * 10))); do
    read -r now_distinct _ _ < <(sink_stats)
    if [ "$now_distinct" -gt "$before" ]; then sending=1; break; fi
    sleep 0.1
  done
  [ -n "$sending" ] || fail "worker $i delivered nothing within ${RESTART_LIMIT_S} s (log: $LOG)"
  at=$((1 + RANDOM % 3))
  sleep "$at"
  read -r distinct dups _ < <(sink_stats)
  kill -9 "$WORKER"; wait "$WORKER" 2>/dev/null || true; WORKER=
  kills=$i
  new=$((dups - prev_dup)); prev_dup=$dups
  [ "$new" -gt "$max_dup" ] && max_dup=$new
  printf '%-6s %-14s %-12s %-10s\n' "$i" "$at" "$distinct" "$new"
  [ "$distinct" -ge "$TOTAL" ] && break
done
start_worker
for _ in $(seq 1 600); do
  read -r distinct dups delivered < <(sink_stats)
  [ "$distinct" -ge "$TOTAL" ] && break
  sleep 1
done
kill -TERM "$WORKER"; wait "$WORKER" || true; WORKER=
read -r distinct dups delivered < <(sink_stats)
new=$((dups - prev_dup)); [ "$new" -gt "$max_dup" ] && max_dup=$new
recorded=$(psql "$DB" -tAc "select coalesce(sum(sent),0) from delivery_seconds")
R=$((CAMPAIGNS * RATE))
per_crash=$((R * (FLUSH_MS + FLUSH_MARGIN_MS) / 1000 + IN_FLIGHT))
bound=$((kills * per_crash))
echo
echo "devices: $TOTAL, delivered distinct: $distinct, lost: $((TOTAL - distinct))"
echo "bound per crash: R × (F + M) + I = $R/s × ($FLUSH_MS + $FLUSH_MARGIN_MS) ms + $IN_FLIGHT = $per_crash"
echo "duplicates: $dups after $kills kills (bound $kills × $per_crash = $bound); largest between two kills: $max_dup"
echo "deliveries: $delivered; delivery_seconds sent: $recorded (sink deliveries - recorded = $((delivered - recorded)): sent but not flushed before a kill)"
[ "$distinct" -eq "$TOTAL" ] || fail "$((TOTAL - distinct)) devices lost"
[ "$dups" -le "$bound" ] || fail "$dups duplicates > bound $bound"
# Every device is recorded at least once; no delivery twice.
[ "$recorded" -ge "$TOTAL" ] && [ "$recorded" -le "$delivered" ] \
  || fail "delivery_seconds sent $recorded is outside [$TOTAL, $delivered]"
echo "PASS: 0 lost, duplicates within the bound, delivery_seconds reconciles"

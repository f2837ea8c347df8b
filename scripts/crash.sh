#!/usr/bin/env bash
# Crash suite (kill -9): a workload of CAMPAIGNS campaigns and CAMPAIGNS × DEVICES devices
# against a loopback sink; the worker is killed with SIGKILL at KILLS random moments and
# restarted each time. Reports lost devices (must be 0), duplicates in total and per
# crash against the bound send_rate × stats_flush + in-flight, and how delivery_seconds
# reconciles with the sink. Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

KILLS=${KILLS:-10}
CAMPAIGNS=${CAMPAIGNS:-10}
DEVICES=${DEVICES:-20000}  # 10 × 20,000 = 200,000 devices
RATE=${RATE:-500}
SINK_PORT=${SINK_PORT:-18090}

scripts/services.sh start >/dev/null
cargo build --release -q
BIN=target/release/pushpace
RUN=$(date +%s)
DB=postgres://postgres@127.0.0.1:5432/pushpace_crash_$RUN
export PUSHPACE__KAFKA__BROKERS=127.0.0.1:9092
export PUSHPACE__KAFKA__TOPIC=crash-$RUN
export PUSHPACE__KAFKA__GROUP_ID=crash-$RUN
export PUSHPACE__DATABASE__URL=$DB
export PUSHPACE__SENDER__URL=http://127.0.0.1:$SINK_PORT/push
export PUSHPACE__HTTP__BIND=127.0.0.1:0
export RUST_LOG=warn
LOG=target/crash-$RUN.log

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

max_dup=0
prev_dup=0
printf '%-6s %-14s %-12s %-10s\n' kill sending_for_s delivered new_dups
for i in $(seq 1 "$KILLS"); do
  start_worker
  # Kill at a random moment while it sends: wait for its first deliveries first (a
  # restarted member waits for the group to drop the killed one, about 6 s).
  read -r before _ _ < <(sink_stats)
  for _ in $(seq 1 600); do
    read -r now_distinct _ _ < <(sink_stats)
    [ "$now_distinct" -gt "$before" ] && break
    sleep 0.1
  done
  at=$((1 + RANDOM % 3))
  sleep "$at"
  read -r distinct dups _ < <(sink_stats)
  kill -9 "$WORKER"; wait "$WORKER" 2>/dev/null || true; WORKER=
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
flush_ms=$($BIN config 2>/dev/null | sed -n 's/.*stats_flush_ms: \([0-9]*\).*/\1/p')
inflight=$($BIN config 2>/dev/null | sed -n 's/.*max_in_flight: \([0-9]*\).*/\1/p')
bound=$((CAMPAIGNS * RATE * flush_ms / 1000 + inflight))
echo
echo "devices: $TOTAL, delivered distinct: $distinct, lost: $((TOTAL - distinct))"
echo "deliveries: $delivered, duplicates: $dups, largest per crash (seen by the next kill): $max_dup (bound $bound)"
echo "delivery_seconds sent: $recorded; sink deliveries - recorded = $((delivered - recorded)) (sent but not flushed before a kill)"
[ "$distinct" -eq "$TOTAL" ] || { echo "FAIL: devices lost"; exit 1; }

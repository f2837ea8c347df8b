#!/usr/bin/env bash
# PostgreSQL outage of OUTAGE seconds mid-run. The worker (release build) reaches
# PostgreSQL through a socat proxy on loopback, which is stopped for the outage and
# started again: every connection drops and new ones are refused, while tansu, which
# stores its own data in the same PostgreSQL, keeps running. Sends go to a `pushpace sink`
# process. Reports the sends per second around the outage, what /readyz said during it,
# and at the end: lost (devices the sink never saw), duplicates, and whether the
# delivery_seconds totals equal what the sink delivered. Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

OUTAGE=${OUTAGE:-30}
BEFORE=${BEFORE:-10}
CAMPAIGNS=${CAMPAIGNS:-10}
RATE=${RATE:-500}
# Enough work to outlast the outage: BEFORE + OUTAGE + 30 s at RATE.
DEVICES=${DEVICES:-$((RATE * (BEFORE + OUTAGE + 30)))}

scripts/services.sh start >/dev/null
command -v socat >/dev/null || {
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && apt-get install -y -qq socat >/dev/null
}
cargo build --release -q
BIN=target/release/pushpace
RUN=$(date +%s)
PG_PORT=$((20000 + RUN % 10000))
SINK_PORT=$((PG_PORT + 1))
API_PORT=$((PG_PORT + 2))
DIRECT=postgres://postgres@127.0.0.1:5432/pushpace_outage_$RUN
export PUSHPACE__KAFKA__BROKERS=127.0.0.1:9092
export PUSHPACE__KAFKA__TOPIC=outage-$RUN
export PUSHPACE__KAFKA__GROUP_ID=outage-$RUN
export PUSHPACE__DATABASE__URL=postgres://postgres@127.0.0.1:$PG_PORT/pushpace_outage_$RUN
export PUSHPACE__SENDER__URL=http://127.0.0.1:$SINK_PORT/push
export PUSHPACE__HTTP__BIND=127.0.0.1:$API_PORT
export RUST_LOG=info,sqlx=warn,rdkafka=warn
mkdir -p target/outage
LOG=target/outage/$RUN.log
SAMPLES=target/outage/$RUN.samples

proxy() {
  socat TCP-LISTEN:$PG_PORT,bind=127.0.0.1,fork,reuseaddr TCP:127.0.0.1:5432 & P=$!
  for _ in $(seq 1 50); do (exec 3<>"/dev/tcp/127.0.0.1/$PG_PORT") 2>/dev/null && return; sleep 0.1; done
  echo "the proxy did not start on $PG_PORT"; exit 1
}
sink_stats() { curl -sf "http://127.0.0.1:$SINK_PORT/_sink/stats"; }
pids=()
cleanup() { for p in "${pids[@]}" ${P:-}; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

proxy
$BIN sink --bind 127.0.0.1:$SINK_PORT >>"$LOG" 2>&1 & pids+=($!)
$BIN migrate >>"$LOG" 2>&1
echo "producing $CAMPAIGNS campaigns × $DEVICES devices at $RATE/s each…"
$BIN produce --campaigns "$CAMPAIGNS" --devices-per-campaign "$DEVICES" --send-rate "$RATE" \
  --jobs-size 500 --prefix "outage$RUN" >/dev/null 2>>"$LOG"
TOTAL=$((CAMPAIGNS * DEVICES))

$BIN run >>"$LOG" 2>&1 & W=$!; pids+=($W)
start=$(date +%s.%N)
phase=up
cut_at=""
: >"$SAMPLES"
deadline=$(( $(date +%s) + BEFORE + OUTAGE + 600 ))
while :; do
  now=$(date +%s.%N)
  t=$(python3 -c "print(f'{$now - $start:.1f}')")
  requests=$(sink_stats | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])' 2>/dev/null || echo 0)
  ready=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$API_PORT/readyz" || echo 000)
  echo "$t $phase $requests $ready" >>"$SAMPLES"
  if [ "$phase" = up ] && [ "$requests" -gt 0 ] && [ -z "$cut_at" ]; then
    first_send=$t; cut_at=$(python3 -c "print($t + $BEFORE)")
  fi
  if [ -n "$cut_at" ] && [ "$phase" = up ] && python3 -c "import sys; sys.exit(0 if $t >= $cut_at else 1)"; then
    echo "t=${t}s: cutting PostgreSQL for ${OUTAGE}s"
    kill "$P"; wait "$P" 2>/dev/null || true
    # socat's forked children hold the open connections: end them too.
    pkill -f "TCP-LISTEN:$PG_PORT" || true
    phase=down; back_at=$(python3 -c "print($t + $OUTAGE)")
  elif [ "$phase" = down ] && python3 -c "import sys; sys.exit(0 if $t >= $back_at else 1)"; then
    echo "t=${t}s: PostgreSQL reachable again"
    proxy; phase=after
  fi
  if [ "$phase" = after ]; then
    done_rows=$(psql "$DIRECT" -tAc "select coalesce(sum(sent),0) from delivery_seconds" 2>/dev/null || echo 0)
    [ "$done_rows" -ge "$TOTAL" ] && break
  fi
  [ "$(date +%s)" -ge "$deadline" ] && { echo "timed out"; break; }
  sleep 1
done
kill -TERM "$W"; wait "$W" || true
summary=$(sink_stats)
recorded=$(psql "$DIRECT" -tAc "select coalesce(sum(sent),0) from delivery_seconds")
python3 - "$SAMPLES" "$TOTAL" "$recorded" "$summary" <<'PY'
import json, sys
rows = [l.split() for l in open(sys.argv[1])]
total, recorded, s = int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
def rate(phase):
    r = [x for x in rows if x[1] == phase]
    if len(r) < 2: return 0.0, 0
    return (int(r[-1][2]) - int(r[0][2])) / max(float(r[-1][0]) - float(r[0][0]), 1e-9), len(r)
down = [x for x in rows if x[1] == "down"]
ready_down = sorted({x[3] for x in down})
# When did sending stop during the outage: the last sample whose count still rose.
stopped = None
for a, b in zip(down, down[1:]):
    if int(b[2]) > int(a[2]): stopped = float(b[0]) - float(down[0][0])
print(f"sends/s before the outage {rate('up')[0]:.0f}, during {rate('down')[0]:.0f}, after {rate('after')[0]:.0f}")
print(f"during the outage: sending went on for {stopped or 0:.0f} s of it, then paused; /readyz answered {','.join(ready_down)}")
lost = total - s["distinct_delivered"]
print(f"devices {total}: delivered distinct {s['distinct_delivered']}, lost {lost}, duplicates {s['duplicates']}")
print(f"delivery_seconds sum(sent) {recorded} vs sink delivered {s['delivered']}: "
      + ("EXACT" if recorded == s["delivered"] else f"differs by {s['delivered'] - recorded}"))
sys.exit(0 if lost == 0 and recorded == s["delivered"] else 1)
PY
echo "log $LOG; samples $SAMPLES"

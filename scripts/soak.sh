#!/usr/bin/env bash
# Soak: CAMPAIGNS campaigns with rates summing to TOTAL_RATE/s for DURATION seconds, null
# sender, release build, real broker and PostgreSQL. Samples the worker's RSS every 10 s
# and reports whether it stays flat (±10% after warm-up), and the per-second accuracy of
# every campaign from delivery_seconds. Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-600}
CAMPAIGNS=${CAMPAIGNS:-100}
TOTAL_RATE=${TOTAL_RATE:-20000}
WARMUP=${WARMUP:-60}
RATE=$((TOTAL_RATE / CAMPAIGNS))
DEVICES=$((RATE * DURATION))

scripts/services.sh start >/dev/null
cargo build --release -q
BIN=target/release/pushpace
RUN=$(date +%s)
DB=postgres://postgres@127.0.0.1:5432/pushpace_soak_$RUN
export PUSHPACE__KAFKA__BROKERS=127.0.0.1:9092
export PUSHPACE__KAFKA__TOPIC=soak-$RUN
export PUSHPACE__KAFKA__GROUP_ID=soak-$RUN
export PUSHPACE__DATABASE__URL=$DB
export PUSHPACE__SENDER__KIND=null
export PUSHPACE__HTTP__BIND=127.0.0.1:0
export RUST_LOG=warn
LOG=target/soak-$RUN.log
RSS=target/soak-$RUN.rss

$BIN migrate >/dev/null
echo "producing $CAMPAIGNS campaigns × $DEVICES devices at $RATE/s each…"
$BIN produce --campaigns "$CAMPAIGNS" --devices-per-campaign "$DEVICES" --send-rate "$RATE" \
  --jobs-size 2000 --prefix "soak$RUN" >/dev/null 2>>"$LOG"
TOTAL=$((CAMPAIGNS * DEVICES))

$BIN run 2>>"$LOG" &
W=$!
trap 'kill -9 $W 2>/dev/null || true' EXIT
start=$(date +%s)
deadline=$((start + DURATION * 2 + 120))
while kill -0 "$W" 2>/dev/null; do
  t=$(( $(date +%s) - start ))
  rss=$(awk '/VmRSS/ {print $2}' /proc/$W/status)
  sent=$(psql "$DB" -tAc "select coalesce(sum(sent),0) from delivery_seconds")
  echo "$t $rss $sent" >>"$RSS"
  [ "$sent" -ge "$TOTAL" ] && break
  [ "$(date +%s)" -ge "$deadline" ] && { echo "timed out"; break; }
  sleep 10
done
kill -TERM "$W"; wait "$W" || true
trap - EXIT

# Steady state: after the warm-up, while more than a minute of work is left; in the last
# minute campaigns finish one by one and their buffers are freed (reported apart).
python3 - "$RSS" "$WARMUP" "$TOTAL" "$TOTAL_RATE" <<'PY'
import sys
rows = [tuple(map(int, l.split())) for l in open(sys.argv[1])]
warmup, total, rate = int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
steady = [r for r in rows if r[0] >= warmup and r[2] <= total - 60 * rate]
rss = [r[1] / 1024 for r in steady] or [0]
mean = sum(rss) / len(rss)
print(f"RSS in the steady state (after {warmup} s, until the last minute of work): "
      f"min {min(rss):.1f} MB, max {max(rss):.1f} MB, mean {mean:.1f} MB, "
      f"within {100*max(mean-min(rss), max(rss)-mean)/mean:.1f}% of the mean ({len(rss)} samples)")
tail = [f"{r[1] / 1024:.0f}" for r in rows if r[2] > total - 60 * rate]
print(f"RSS in the last minute of work (campaigns finishing): {', '.join(tail)} MB")
print(f"run time: {rows[-1][0]} s, sent {rows[-1][2]}")
PY
psql "$DB" -tA -F' ' -c "
  with s as (
    select d.campaign_id, d.second, d.sent, c.send_rate,
           min(d.second) over (partition by d.campaign_id) as first_s,
           max(d.second) over (partition by d.campaign_id) as last_s
    from delivery_seconds d join campaigns c on c.id = d.campaign_id)
  select count(*),
         round(percentile_cont(0.5) within group (order by abs(sent - send_rate) / send_rate)::numeric, 4),
         round(percentile_cont(0.99) within group (order by abs(sent - send_rate) / send_rate)::numeric, 4),
         round(max(abs(sent - send_rate) / send_rate)::numeric, 4),
         max(sent), min(send_rate)
  from s where second > first_s and second < last_s" |
  awk '{printf "campaign-seconds (first and last of each campaign excluded): %s; |sent-rate|/rate p50 %s, p99 %s, max %s; largest second %s at rate %s\n", $1, $2, $3, $4, $5, $6}'
# Seconds where most campaigns were off together point at the process (or the machine),
# not at one campaign's jobs; the scheduler logs a warning when it wakes late.
psql "$DB" -tA -F' ' -c "
  with s as (
    select d.campaign_id, d.second, d.sent, c.send_rate,
           min(d.second) over (partition by d.campaign_id) as first_s,
           max(d.second) over (partition by d.campaign_id) as last_s
    from delivery_seconds d join campaigns c on c.id = d.campaign_id),
  off as (
    select second, count(*) as campaigns, min(sent) as lowest, max(send_rate) as rate
    from s where second > first_s and second < last_s
      and abs(sent - send_rate) / send_rate > 0.01
    group by second)
  select extract(epoch from second - (select min(second) from s))::int, campaigns, lowest, rate
  from off where campaigns >= $((CAMPAIGNS / 2)) order by second" |
  awk 'BEGIN {n = 0} {n++; printf "  process-wide off second at +%ss: %s campaigns off, lowest %s of %s\n", $1, $2, $3, $4} END {printf "process-wide off seconds: %d\n", n}'
echo "scheduler late-wake warnings: $(grep -c 'woke late' "$LOG" || true)"
grep 'woke late' "$LOG" | head -20 || true
echo "total devices $TOTAL; log $LOG; RSS samples $RSS"

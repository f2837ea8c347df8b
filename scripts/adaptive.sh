#!/usr/bin/env bash
# The adaptive provider ceiling against a hidden quota, with and without it, on the
# release build: a `pushpace sink` process answers 429 past QUOTA/s (a token bucket the
# worker does not know), CAMPAIGNS campaigns ask RATE/s each, and the worker runs for
# SECONDS with `adaptive = true`, then again with `adaptive = false`. Prints, per run,
# what the sink delivered per second, the share of requests refused, 429s per delivered
# notification and, for the adaptive run, the ceiling's path from GET /api/providers.
# Loopback only; stops by itself.
set -euo pipefail
cd "$(dirname "$0")/.."

QUOTA=${QUOTA:-2000}
CAMPAIGNS=${CAMPAIGNS:-5}
RATE=${RATE:-1000}
SECONDS_RUN=${SECONDS_RUN:-40}
DEVICES=$((RATE * (SECONDS_RUN + 20)))

scripts/services.sh start >/dev/null
cargo build --release -q
BIN=target/release/pushpace
RUN=$(date +%s)
SINK_PORT=$((20000 + RUN % 10000))
API_PORT=$((SINK_PORT + 1))
mkdir -p target/adaptive
export PUSHPACE__KAFKA__BROKERS=127.0.0.1:9092
export PUSHPACE__HTTP__BIND=127.0.0.1:$API_PORT
export PUSHPACE__SENDER__DEFAULT_PROVIDER=hook
export PUSHPACE__PROVIDERS__HOOK__KIND=webhook
export PUSHPACE__PROVIDERS__HOOK__URL=http://127.0.0.1:$SINK_PORT/push
export RUST_LOG=info,sqlx=warn,rdkafka=warn

pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

one_run() {
  local adaptive=$1 tag="adaptive-$1-$RUN" log=target/adaptive/$RUN-$1.log
  export PUSHPACE__PROVIDERS__HOOK__ADAPTIVE=$adaptive
  export PUSHPACE__KAFKA__TOPIC=$tag PUSHPACE__KAFKA__GROUP_ID=$tag
  export PUSHPACE__DATABASE__URL=postgres://postgres@127.0.0.1:5432/pushpace_${RUN}_$1
  $BIN sink --bind 127.0.0.1:$SINK_PORT >>"$log" 2>&1 & local sink=$!; pids+=($sink)
  for _ in $(seq 1 50); do curl -sf "http://127.0.0.1:$SINK_PORT/_sink/stats" >/dev/null && break; sleep 0.1; done
  curl -sf -X PUT -H 'content-type: application/json' \
    -d "{\"behaviour\":{\"mode\":\"quota\",\"per_second\":$QUOTA,\"burst\":$((QUOTA / 20)),\"retry_after\":null}}" \
    "http://127.0.0.1:$SINK_PORT/_sink/behaviour" >/dev/null
  $BIN migrate >>"$log" 2>&1
  $BIN produce --campaigns "$CAMPAIGNS" --devices-per-campaign "$DEVICES" --send-rate "$RATE" \
    --jobs-size 500 --prefix "$tag" >/dev/null 2>>"$log"
  $BIN run >>"$log" 2>&1 & local w=$!; pids+=($w)
  # From the first request on, SECONDS_RUN seconds.
  for _ in $(seq 1 600); do
    [ "$(curl -sf "http://127.0.0.1:$SINK_PORT/_sink/stats" | python3 -c 'import json,sys; print(json.load(sys.stdin)["requests"])')" -gt 0 ] && break
    sleep 0.1
  done
  sleep "$SECONDS_RUN"
  curl -sf "http://127.0.0.1:$API_PORT/api/providers" >"target/adaptive/$RUN-$1.providers.json" || true
  curl -sf "http://127.0.0.1:$SINK_PORT/_sink/stats" >"target/adaptive/$RUN-$1.sink.json"
  kill -TERM "$w"; wait "$w" || true
  kill -TERM "$sink"; wait "$sink" || true
}

one_run true
one_run false
python3 - "$RUN" "$SECONDS_RUN" "$QUOTA" "$((CAMPAIGNS * RATE))" <<'PY'
import json, sys
run, secs, quota, asked = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
print(f"{asked}/s asked against a hidden {quota}/s quota, {secs} s each")
print(f"{'ceiling':<9} {'delivered/s':>12} {'refused':>9} {'429s/delivered':>15}")
for mode in ("true", "false"):
    s = json.load(open(f"target/adaptive/{run}-{mode}.sink.json"))
    refused = s["requests"] - s["delivered"]
    print(f"{'on' if mode == 'true' else 'off':<9} {s['delivered'] / secs:>12.0f} "
          f"{100 * refused / max(s['requests'], 1):>8.2f}% {refused / max(s['delivered'], 1):>15.3f}")
try:
    p = next(x for x in json.load(open(f"target/adaptive/{run}-true.providers.json")) if x["name"] == "hook")
    h = p["history"]
    band = next((i for i, x in enumerate(h) if x["accepted"] >= 0.9 * quota), None)
    print(f"adaptive: state {p['state']}, ceiling {p['ceiling']}, congested seconds {p['congestion']}")
    print("ceiling per second (first 20):", [round(x["ceiling"] or x["demand"]) for x in h[:20]])
    print("accepted per second (first 20):", [round(x["accepted"]) for x in h[:20]])
except (OSError, StopIteration, ValueError) as e:
    print("no /api/providers snapshot:", e)
PY

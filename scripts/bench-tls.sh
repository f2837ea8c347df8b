#!/usr/bin/env bash
# What Kafka over TLS + SASL costs the worker end to end: `pushpace bench --phases
# consumer,null` against the plaintext broker (127.0.0.1:9092) and against the SASL_SSL
# one (localhost:9093, SCRAM-SHA-512; scripts/kafka-secure.sh), alternating
# plain, tls three times in one run of this script so that both see the same machine.
# Prints each round and the ratios (tls / plain) of the medians; figures go to
# docs/BENCHMARKS.md.
#
#   scripts/bench-tls.sh [devices]      (default 1,000,000)
set -euo pipefail
cd "$(dirname "$0")/.."
DEVICES=${1:-1000000}
TOOLS=${PUSHPACE_TOOLS_DIR:-$HOME/.cache/pushpace}
CERTS="$TOOLS/kafka-tls"
OUT=target/bench/tls
mkdir -p "$OUT"
[ -f "$CERTS/ca.pem" ] || { echo "no test CA: run scripts/kafka-secure.sh start" >&2; exit 1; }
cargo build --release --quiet
BIN=target/release/pushpace

round() { # name, then env assignments
  local name=$1
  shift
  env "$@" "$BIN" bench --phases consumer,null --devices "$DEVICES" \
    --out-dir "$OUT" --json "$OUT/$name.json" >"$OUT/$name.txt" 2>&1 ||
    { cat "$OUT/$name.txt" >&2; exit 1; }
  grep -E '^(consumer|null) ' "$OUT/$name.txt" | sed "s/^/$name /"
}

PLAIN=(PUSHPACE__KAFKA__BROKERS=127.0.0.1:9092)
TLS=(PUSHPACE__KAFKA__BROKERS=localhost:9093
  PUSHPACE__KAFKA__SECURITY_PROTOCOL=sasl_ssl
  PUSHPACE__KAFKA__SASL_MECHANISM=SCRAM-SHA-512
  PUSHPACE__KAFKA__SASL_USERNAME=pushpace
  PUSHPACE__KAFKA__SASL_PASSWORD_FILE="$CERTS/scram.password"
  PUSHPACE__KAFKA__SSL_CA_FILE="$CERTS/ca.pem")

for i in 1 2 3; do
  round "plain-$i" "${PLAIN[@]}"
  round "tls-$i" "${TLS[@]}"
done

python3 - "$OUT" <<'EOF'
import json, sys
out = sys.argv[1]
def rates(kind):
    got = {}
    for i in (1, 2, 3):
        report = json.load(open(f"{out}/{kind}-{i}.json"))
        for p in report["phases"]:
            got.setdefault(p["phase"], []).append(p["per_second"])
    return {k: sorted(v)[len(v) // 2] for k, v in got.items()}
plain, tls = rates("plain"), rates("tls")
for phase in ("consumer", "null"):
    print(f"{phase}: plaintext {plain[phase]:.0f}/s, sasl_ssl {tls[phase]:.0f}/s, "
          f"ratio {tls[phase] / plain[phase]:.3f}")
EOF

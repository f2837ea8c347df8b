#!/usr/bin/env bash
# The demo: makes sure PostgreSQL answers, builds in release mode and runs `pushpace demo`
# (embedded Kafka broker, in-process loopback provider sink). Extra arguments go to the demo.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh postgres
cargo build --release --quiet
exec target/release/pushpace demo "$@"

#!/usr/bin/env bash
# The whole test suite: makes sure PostgreSQL and the tansu broker run, then runs every
# test against them, then clippy with warnings as errors.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh start
export PUSHPACE_TEST_BROKERS=${PUSHPACE_TEST_BROKERS:-127.0.0.1:9092}
export PUSHPACE_TEST_PG=${PUSHPACE_TEST_PG:-postgres://postgres@127.0.0.1:5432}
export PUSHPACE_TANSU_BIN=${PUSHPACE_TANSU_BIN:-${PUSHPACE_TOOLS_DIR:-$HOME/.cache/pushpace}/tansu-0.6.0/bin/tansu}

# A failing test's message (with its file and line) stays in the log's last lines,
# not above a backtrace.
export RUST_BACKTRACE=0

cargo fmt --all -- --check
# Everything but the pacing tests, in parallel.
cargo test --lib --bins --tests -- --skip paced_ --test-threads "${PUSHPACE_TEST_THREADS:-4}"
# The benchmarks once each, as a check that they still run (criterion's test mode).
cargo test --benches
# The pacing tests (and the few timed ones, named paced_ too) measure rates and
# latencies: one at a time, on a machine left quiet.
cargo test --test it paced_ -- --test-threads 1
cargo clippy --all-targets -- -D warnings

#!/usr/bin/env bash
# The full test suite, exactly as CI runs it: installs the test brokers and clients,
# checks formatting and that the library's dependency graph has no C, builds everything, and runs
# every test binary (the integration tests start their own brokers, Apache Kafka JVMs and tansu,
# on loopback ports).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

# A hung test must not hold CI for its full 90 minutes; the suite normally takes far less.
TEST_TIMEOUT=${KAFKA_LOCK_TEST_TIMEOUT:-45m}

started=$SECONDS
step() { printf '\n==> [%4ds] %s\n' "$((SECONDS - started))" "$*"; }

step "installing test dependencies (scripts/install-test-deps.sh)"
scripts/install-test-deps.sh

step "cargo fmt --check"
cargo fmt --all -- --check

step "no C in the library: cargo tree -e normal,build --no-default-features"
# A "-sys" crate links a C library and "cc" compiles C at build time; either would break the
# promise of a pure-Rust library (and of a static musl CLI binary).
deps=$(cargo tree -e normal,build --no-default-features --prefix none --format '{p}' | awk '{print $1}' | sort -u)
offenders=$(grep -E -- '(-sys$|^cc$)' <<<"$deps" || true)
if [[ -n "$offenders" ]]; then
    echo "the library depends on C through: $offenders" >&2
    cargo tree -e normal,build --no-default-features -i "$(head -n1 <<<"$offenders")" >&2 || true
    exit 1
fi
echo "ok: $(wc -l <<<"$deps") crates, none of them -sys or cc"

step "no C in the CLI either: cargo tree -e normal,build --features cli"
# linux-raw-sys is the one exception: Linux's kernel ABI (constants, structs) as Rust source for
# rustix's raw system calls, with no build script and nothing to link.
deps=$(cargo tree -e normal,build --features cli --prefix none --format '{p}' | awk '{print $1}' | sort -u)
offenders=$(grep -E -- '(-sys$|^cc$)' <<<"$deps" | grep -vx 'linux-raw-sys' || true)
if [[ -n "$offenders" ]]; then
    echo "the CLI depends on C through: $offenders" >&2
    cargo tree -e normal,build --features cli -i "$(head -n1 <<<"$offenders")" >&2 || true
    exit 1
fi
echo "ok: $(wc -l <<<"$deps") crates, none of them cc or -sys but linux-raw-sys (no C)"

step "cargo build --all-targets --all-features"
cargo build --all-targets --all-features

step "static CLI binary: scripts/build-static.sh, scripts/check-static.sh"
scripts/build-static.sh
scripts/check-static.sh

step "cargo test --all-features --no-fail-fast (timeout $TEST_TIMEOUT)"
timeout --kill-after=30s "$TEST_TIMEOUT" cargo test --all-features --no-fail-fast

step "all checks passed"

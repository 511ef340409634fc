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

step "no C in the CLI but TLS's crypto provider: cargo tree -e normal,build --features cli"
# linux-raw-sys is one exception: Linux's kernel ABI (constants, structs) as Rust source for
# rustix's raw system calls, with no build script and nothing to link. The other is `cc`, and
# only as the build dependency of `ring` (the `tls` feature's crypto provider, C and assembly):
# nothing else may bring C.
deps=$(cargo tree -e normal,build --features cli --prefix none --format '{p}' | awk '{print $1}' | sort -u)
cc_users=$(cargo tree -e normal,build --features cli -i cc --prefix none --format '{p}' --depth 1 2>/dev/null \
    | awk 'NR > 1 {print $1}' | sort -u)
if [[ -n "$cc_users" && "$cc_users" != "ring" ]]; then
    echo "cc is built for more than ring: $cc_users" >&2
    exit 1
fi
offenders=$(grep -E -- '(-sys$|^cc$)' <<<"$deps" | grep -vx -e 'linux-raw-sys' -e 'cc' || true)
if [[ -n "$offenders" ]]; then
    echo "the CLI depends on C through: $offenders" >&2
    cargo tree -e normal,build --features cli -i "$(head -n1 <<<"$offenders")" >&2 || true
    exit 1
fi
echo "ok: $(wc -l <<<"$deps") crates; C only in ring (through cc), no -sys but linux-raw-sys (no C)"

step "no C at all in the graviola TLS builds: cargo tree -e normal,build --features tls-graviola (x86_64, aarch64)"
# The library with `tls-graviola`, and the static CLI's feature set (scripts/build-static.sh), for
# both targets of the static binaries: no `cc`, and no -sys crate but linux-raw-sys (the kernel's
# ABI as Rust source, nothing to compile or link). The CLI's set includes `oauth` (ureq on the same
# rustls, without a provider of its own).
for target in x86_64-unknown-linux-musl aarch64-unknown-linux-musl; do
    for features in tls-graviola cli-base,tls-graviola,oauth; do
        deps=$(cargo tree -e normal,build --no-default-features --features "$features" --target "$target" \
            --prefix none --format '{p}' | awk '{print $1}' | sort -u)
        grep -qx 'rustls-graviola' <<<"$deps" || { echo "$features on $target: no rustls-graviola in the graph" >&2; exit 1; }
        offenders=$(grep -E -- '(-sys$|^cc$|^ring$|^aws-lc)' <<<"$deps" | grep -vx 'linux-raw-sys' || true)
        if [[ -n "$offenders" ]]; then
            echo "--features $features for $target depends on C through: $offenders" >&2
            cargo tree -e normal,build --no-default-features --features "$features" --target "$target" \
                -i "$(head -n1 <<<"$offenders")" >&2 || true
            exit 1
        fi
        echo "ok: --features $features for $target: $(wc -l <<<"$deps") crates, no cc, ring or -sys but linux-raw-sys"
    done
done

step "library users compile no CLI: cargo tree --no-default-features has no clap, rustix, log formatter or metrics"
cli_only=$(cargo tree -e normal --no-default-features --prefix none --format '{p}' | awk '{print $1}' \
    | grep -E -x 'clap|clap_complete|clap_mangen|humantime|tracing-subscriber|rustix|metrics|metrics-exporter-prometheus' || true)
if [[ -n "$cli_only" ]]; then
    echo "the library without default features still pulls in: $cli_only" >&2
    exit 1
fi
echo "ok"

step "what a published crate carries: cargo package --list"
# No test-broker jars, captured frames or fuzz corpora; the licences and the docs.
files=$(cargo package --list --allow-dirty 2>/dev/null)
for must in README.md CHANGELOG.md LICENSE-MIT LICENSE-APACHE src/lib.rs; do
    grep -qx "$must" <<<"$files" || { echo "the package lacks $must" >&2; exit 1; }
done
if grep -E '^(testdata|fuzz|\.tools)/' <<<"$files" >/dev/null; then
    echo "the package carries test data: $(grep -E '^(testdata|fuzz|\.tools)/' <<<"$files" | head -3)" >&2
    exit 1
fi
echo "ok: $(wc -l <<<"$files") files"

step "the examples build for library users: cargo build --examples --no-default-features"
cargo build --examples --no-default-features

step "cargo build --all-targets --all-features"
cargo build --all-targets --all-features

step "cargo clippy --all-targets --all-features -- -D warnings"
cargo clippy --all-targets --all-features -- -D warnings

step "cargo doc --no-deps (warnings are errors)"
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --no-default-features --quiet
RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --all-features --quiet

step "the layers import in one direction, and no sans-I/O module reaches error.rs: scripts/import_cycles.py"
python3 scripts/import_cycles.py

step "no other crate's type in the stable API but tokio's: rustdoc JSON, scripts/public_api_types.py"
# rustdoc's JSON output is nightly-only; its own target dir keeps nightly artefacts apart.
if command -v rustup >/dev/null 2>&1; then
    rustup toolchain install nightly --profile minimal --no-self-update >/dev/null 2>&1 \
        || { echo "cannot install nightly Rust with rustup (rustdoc JSON needs it)" >&2; exit 1; }
    api_dir="${CARGO_TARGET_DIR:-target}/public-api"
    CARGO_TARGET_DIR="$api_dir" cargo +nightly rustdoc --lib --no-default-features --quiet -- \
        -Z unstable-options --output-format json --document-hidden-items
    python3 scripts/public_api_types.py "$api_dir/doc/kafka_lock.json"
else
    echo "rustup not found: the public API check needs it to install nightly Rust" >&2
    exit 1
fi

msrv=$(sed -n 's/^rust-version = "\(.*\)"$/\1/p' Cargo.toml)
step "the stated MSRV builds everything: cargo +$msrv check --locked --all-targets --all-features"
# The toolchain is installed minimal (no docs, no clippy); its own target dir keeps it from
# rebuilding the main one.
if command -v rustup >/dev/null 2>&1; then
    rustup toolchain install "$msrv" --profile minimal --no-self-update >/dev/null 2>&1 \
        || { echo "cannot install Rust $msrv with rustup" >&2; exit 1; }
    CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/msrv" cargo "+$msrv" check --locked --all-targets --all-features --quiet
    echo "ok: Rust $msrv"
else
    echo "rustup not found: the MSRV check needs it to install Rust $msrv" >&2
    exit 1
fi

step "static CLI binaries: scripts/build-static.sh, scripts/check-static.sh (x86_64, aarch64)"
scripts/build-static.sh x86_64
scripts/check-static.sh x86_64
# The ARM64 binary is built and checked too; it runs here only where qemu-user is installed.
scripts/build-static.sh aarch64
scripts/check-static.sh aarch64
# Both, on the secured test broker over SASL_SSL (`status`; `run` where native), the aarch64 one
# through qemu-aarch64-static (skipped, and said so, without qemu-user-static).
command -v qemu-aarch64-static >/dev/null 2>&1 || export KAFKA_LOCK_ALLOW_NO_QEMU=1
timeout --kill-after=30s 15m cargo test --all-features --test it -- --ignored --exact \
    cli::secured::static_binaries_over_sasl_ssl

step "cargo test --all-features --no-fail-fast (timeout $TEST_TIMEOUT)"
timeout --kill-after=30s "$TEST_TIMEOUT" cargo test --all-features --no-fail-fast

step "all checks passed"

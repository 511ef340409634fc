#!/usr/bin/env bash
# Builds the kafka-lock CLI as one fully static executable (Rust's musl target: the C library is
# linked in, nothing is loaded at run time), for cron hosts of any distribution and FROM scratch
# images (docker/Dockerfile).
#
#   scripts/build-static.sh [x86_64|aarch64]   then   scripts/check-static.sh [x86_64|aarch64]
#
# Output: $CARGO_TARGET_DIR (default target/)/x86_64-unknown-linux-musl/release/kafka-lock. The release profile in Cargo.toml
# (strip, LTO, opt-level "z", panic = "abort") keeps it small.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

# x86_64 by default; `scripts/build-static.sh aarch64` builds the ARM64 binary (linked by
# rust-lld, which rustup ships, so no cross C toolchain is needed either).
case "${1:-x86_64}" in
    x86_64) TARGET="x86_64-unknown-linux-musl" ;;
    aarch64) TARGET="aarch64-unknown-linux-musl"
             export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_MUSL_LINKER=rust-lld ;;
    *) printf 'build-static: usage: scripts/build-static.sh [x86_64|aarch64]\n' >&2; exit 64 ;;
esac

say() { printf 'build-static: %s\n' "$*"; }
die() { printf 'build-static: ERROR: %s\n' "$*" >&2; exit 1; }

# The musl target ships with rustup as a prebuilt standard library (and its own linker support):
# no musl-gcc or C toolchain for musl is needed, because kafka-lock has no C dependencies.
if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx "$TARGET"; then
        say "adding the Rust target $TARGET"
        rustup target add "$TARGET"
    fi
else
    rustc --print target-libdir --target "$TARGET" >/dev/null 2>&1 \
        || die "no rustup, and this Rust toolchain has no $TARGET standard library; install the target"
fi

# TLS (the `tls` feature, in `cli`) needs ring's C and assembly compiled for the target. For
# x86_64 the host's C compiler does; for aarch64 a cross C compiler is needed (CC_aarch64_unknown_
# linux_musl, aarch64-linux-musl-gcc, aarch64-linux-gnu-gcc or clang). Without one, the aarch64
# binary is built without TLS (`cli-base`): it refuses SSL and SASL_SSL with a message saying so.
features=cli
if [[ "$TARGET" == x86_64-* && -z "${CC_x86_64_unknown_linux_musl:-}" ]] \
    && ! command -v x86_64-linux-musl-gcc >/dev/null 2>&1 && ! command -v musl-gcc >/dev/null 2>&1; then
    # ring's C needs only the compiler's own headers (stdint.h, stddef.h), so the host's x86_64
    # compiler builds it for musl as well; the Rust linker makes the binary static.
    export CC_x86_64_unknown_linux_musl=cc
fi
if [[ "$TARGET" == aarch64-* ]]; then
    cross_cc=${CC_aarch64_unknown_linux_musl:-}
    if [[ -z "$cross_cc" ]]; then
        for c in aarch64-linux-musl-gcc aarch64-linux-gnu-gcc clang; do
            if command -v "$c" >/dev/null 2>&1; then cross_cc=$c; break; fi
        done
    fi
    if [[ -z "$cross_cc" ]]; then
        say "no aarch64 C compiler for ring: building the aarch64 binary WITHOUT TLS (cli-base)"
        features=cli-base
    else
        export CC_aarch64_unknown_linux_musl="$cross_cc"
        [[ "$cross_cc" == clang ]] && export CFLAGS_aarch64_unknown_linux_musl="--target=aarch64-linux-musl"
    fi
fi

say "cargo build --release --target $TARGET --no-default-features --features $features --bin kafka-lock"
cargo build --release --target "$TARGET" --no-default-features --features "$features" --bin kafka-lock

bin="${CARGO_TARGET_DIR:-$repo/target}/$TARGET/release/kafka-lock"
[[ -x "$bin" ]] || die "the build did not produce $bin"
say "built $bin ($(stat -c %s "$bin") bytes)"

#!/usr/bin/env bash
# Builds the kafka-lock CLI as one fully static executable (Rust's musl target: the C library is
# linked in, nothing is loaded at run time), for cron hosts of any distribution and FROM scratch
# images (docker/Dockerfile).
#
#   scripts/build-static.sh [x86_64|aarch64]   then   scripts/check-static.sh [x86_64|aarch64]
#
# Output: $CARGO_TARGET_DIR (default target/)/<arch>-unknown-linux-musl/release/kafka-lock, with
# TLS on both architectures. The release profile in Cargo.toml (strip, LTO, opt-level "z",
# panic = "abort") keeps it small.
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
# no musl-gcc or C toolchain for musl is needed, because this build has no C dependencies.
if command -v rustup >/dev/null 2>&1; then
    if ! rustup target list --installed | grep -qx "$TARGET"; then
        say "adding the Rust target $TARGET"
        rustup target add "$TARGET"
    fi
else
    rustc --print target-libdir --target "$TARGET" >/dev/null 2>&1 \
        || die "no rustup, and this Rust toolchain has no $TARGET standard library; install the target"
fi

# TLS with the graviola crypto provider (`tls-graviola`): pure Rust, so neither target needs a C
# compiler and both binaries carry TLS. graviola needs CPU extensions (x86_64: AVX2, BMI2, ADX,
# AES-NI, PCLMULQDQ, from about 2014 on; aarch64: AES, SHA2, PMULL, as a Raspberry Pi 5 or any
# Graviton has); on a CPU without them kafka-lock refuses SSL and SASL_SSL with exit 78 and names
# what is missing. KAFKA_LOCK_STATIC_FEATURES=cli builds with ring instead (C: needs a C compiler
# for the target). `oauth` (SASL/OAUTHBEARER; ureq on the same rustls) brings no C either.
features=${KAFKA_LOCK_STATIC_FEATURES:-cli-base,tls-graviola,oauth}
if [[ ",$features," == *",cli,"* || ",$features," == *",tls,"* ]] \
    && [[ "$TARGET" == x86_64-* && -z "${CC_x86_64_unknown_linux_musl:-}" ]] \
    && ! command -v x86_64-linux-musl-gcc >/dev/null 2>&1 && ! command -v musl-gcc >/dev/null 2>&1; then
    # ring's C needs only the compiler's own headers (stdint.h, stddef.h), so the host's x86_64
    # compiler builds it for musl as well; the Rust linker makes the binary static.
    export CC_x86_64_unknown_linux_musl=cc
fi

say "cargo build --release --target $TARGET --no-default-features --features $features --bin kafka-lock"
cargo build --release --target "$TARGET" --no-default-features --features "$features" --bin kafka-lock

bin="${CARGO_TARGET_DIR:-$repo/target}/$TARGET/release/kafka-lock"
[[ -x "$bin" ]] || die "the build did not produce $bin"
say "built $bin ($(stat -c %s "$bin") bytes)"

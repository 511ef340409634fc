#!/usr/bin/env bash
# Checks that the kafka-lock binary from scripts/build-static.sh is what we ship: a fully static
# executable (no program interpreter, no shared libraries), stripped of symbols, within the size
# budget, and working (it prints its version). Exits non-zero with one line per failed check.
#
#   scripts/check-static.sh [x86_64|aarch64|PATH]
#       (default: ${CARGO_TARGET_DIR:-target}/x86_64-unknown-linux-musl/release/kafka-lock)
#
# An aarch64 binary is run through qemu-aarch64-static when it is installed (Debian's
# qemu-user-static); without it the run is skipped and the script says so.
#
# A binary with the graviola TLS provider (the default of scripts/build-static.sh; not when
# KAFKA_LOCK_STATIC_FEATURES names another) is also run on an emulated CPU that lacks what graviola
# needs (qemu-x86_64-static -cpu Nehalem, 2008: no AES-NI, AVX, BMI or ADX), asking for TLS: it
# must exit 78 with one line naming the missing features, not crash. Skipped, and said so,
# without qemu-user-static.
#
# Reads the ELF headers with Python's standard library, so it needs neither `file` nor `readelf`.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
target_dir=${CARGO_TARGET_DIR:-$repo/target}
case "${1:-x86_64}" in
    x86_64) bin="$target_dir/x86_64-unknown-linux-musl/release/kafka-lock" ;;
    aarch64) bin="$target_dir/aarch64-unknown-linux-musl/release/kafka-lock" ;;
    *) bin=$1 ;;
esac
# The budget from the CLI's requirements: 5 MB (decimal megabytes).
MAX_BYTES=${KAFKA_LOCK_MAX_BYTES:-5000000}
PYTHON=${PYTHON:-python3}

[[ -f "$bin" ]] || { printf 'check-static: ERROR: %s does not exist; run scripts/build-static.sh\n' "$bin" >&2; exit 1; }

"$PYTHON" - "$bin" "$MAX_BYTES" <<'PY'
import os
import struct
import subprocess
import sys

path, max_bytes = sys.argv[1], int(sys.argv[2])
failures = []


def fail(msg):
    failures.append(msg)


with open(path, "rb") as f:
    data = f.read()

# ELF header (64-bit little-endian only: the target is x86_64).
if data[:4] != b"\x7fELF":
    sys.exit(f"check-static: FAIL: {path} is not an ELF file")
if data[4] != 2 or data[5] != 1:
    sys.exit(f"check-static: FAIL: {path} is not a 64-bit little-endian ELF file")
(e_type, e_machine, _, _, e_phoff, e_shoff, _, _, e_phentsize, e_phnum, e_shentsize, e_shnum,
 e_shstrndx) = struct.unpack_from("<HHIQQQIHHHHHH", data, 16)
MACHINES = {62: "x86-64", 183: "aarch64"}
if e_machine not in MACHINES:
    fail(f"machine {e_machine} is neither x86-64 (62) nor aarch64 (183)")
# Another architecture runs under user-mode emulation, when the system has it.
runner = []
if e_machine == 183 and os.uname().machine != "aarch64":
    import shutil
    qemu = shutil.which("qemu-aarch64-static") or shutil.which("qemu-aarch64")
    runner = [qemu] if qemu else None

PT_DYNAMIC, PT_INTERP = 2, 3
interp = None
has_dynamic = False
for i in range(e_phnum):
    p_type, _, p_offset, _, _, p_filesz, _, _ = struct.unpack_from(
        "<IIQQQQQQ", data, e_phoff + i * e_phentsize)
    if p_type == PT_INTERP:
        interp = data[p_offset:p_offset + p_filesz].rstrip(b"\0").decode(errors="replace")
    elif p_type == PT_DYNAMIC:
        has_dynamic = True

# Sections: a stripped binary has no symbol table (.symtab) and no DWARF debug info.
SHT_SYMTAB, SHT_DYNAMIC = 2, 6
sections = []
if e_shoff and e_shnum:
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize)
               for i in range(e_shnum)]
    strtab = headers[e_shstrndx]
    names = data[strtab[4]:strtab[4] + strtab[5]]
    for h in headers:
        name = names[h[0]:names.index(b"\0", h[0])].decode(errors="replace")
        sections.append((name, h[1], h[2], h[4], h[5]))

# A static-pie executable (ET_DYN) has a PT_DYNAMIC segment for its own relocations, but no
# interpreter and no DT_NEEDED entries; a dynamic one needs both.
DT_NEEDED = 1
needed = 0
for name, sh_type, _, offset, size in sections:
    if sh_type == SHT_DYNAMIC:
        for j in range(0, size, 16):
            tag, _ = struct.unpack_from("<qQ", data, offset + j)
            if tag == DT_NEEDED:
                needed += 1
            if tag == 0:
                break

kind = {2: "static executable", 3: "static-pie executable"}.get(e_type, f"ELF type {e_type}")
if interp is not None:
    fail(f"has a program interpreter ({interp}): it is dynamically linked")
    kind = "dynamically linked executable"
if needed:
    fail(f"needs {needed} shared libraries (DT_NEEDED)")
if any(s[1] == SHT_SYMTAB for s in sections):
    fail("has a symbol table (.symtab): not stripped")
debug = [s[0] for s in sections if s[0].startswith((".debug_", ".zdebug_"))]
if debug:
    fail(f"has debug sections ({', '.join(debug[:4])}): not stripped")

size = len(data)
if size > max_bytes:
    fail(f"{size} bytes exceeds the budget of {max_bytes} bytes")

# The kernel's loader is the final word on "static": ldd says so for a binary without an
# interpreter. It is only a cross-check, as ldd is missing on some systems.
try:
    out = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30)
    text = (out.stdout + out.stderr).strip()
    if "not a dynamic executable" not in text and "statically linked" not in text:
        fail(f"ldd lists shared libraries: {text.splitlines()[0] if text else '(no output)'}")
except FileNotFoundError:
    pass

# It must run: a static binary built against the wrong C library fails here, not in production.
version = "?"
if runner is None:
    print(f"check-static: not run: {path} is for aarch64 and no qemu-aarch64-static is installed",
          file=sys.stderr)
else:
    try:
        out = subprocess.run(runner + [path, "--version"], capture_output=True, text=True, timeout=60)
        version = out.stdout.strip()
        if out.returncode != 0 or not version.startswith("kafka-lock"):
            fail(f"`{path} --version` failed (status {out.returncode}): {(out.stdout + out.stderr).strip()}")
    except OSError as e:
        fail(f"cannot run {path}: {e}")

for f in failures:
    print(f"check-static: FAIL: {f}", file=sys.stderr)
if failures:
    sys.exit(1)
print(f"check-static: OK: {path}")
print(f"check-static: {version}; {MACHINES.get(e_machine)} {kind}, stripped, no shared libraries; "
      f"{size} bytes ({size / 1e6:.2f} MB, {size / 1048576:.2f} MiB) of a {max_bytes / 1e6:g} MB budget")
PY

features=${KAFKA_LOCK_STATIC_FEATURES:-cli-base,tls-graviola}
if [[ ",$features," == *",tls-graviola,"* ]]; then
    machine=$("$PYTHON" -c 'import struct,sys; print(struct.unpack_from("<H", open(sys.argv[1],"rb").read(20), 18)[0])' "$bin")
    if [[ "$machine" != 62 ]]; then
        # qemu's aarch64 CPU models all have the crypto extensions graviola needs.
        printf 'check-static: older-CPU check: only for x86_64 binaries (no qemu aarch64 CPU model lacks AES/PMULL/SHA2)\n'
    elif ! command -v qemu-x86_64-static >/dev/null 2>&1; then
        printf 'check-static: older-CPU check SKIPPED: no qemu-x86_64-static (install qemu-user-static)\n' >&2
    else
        set +e
        err=$(timeout 60 qemu-x86_64-static -cpu Nehalem "$bin" run --bootstrap 127.0.0.1:9 --lock cpu-check \
            -X security.protocol=SSL -- true 2>&1 >/dev/null)
        status=$?
        set -e
        if [[ $status != 78 || "$err" != *"lacks"*"avx2"* || $(wc -l <<<"$err") != 1 ]]; then
            printf 'check-static: FAIL: on an emulated Nehalem CPU, TLS should exit 78 naming avx2 in one line; got %s: %s\n' "$status" "$err" >&2
            exit 1
        fi
        printf 'check-static: OK: on an emulated Nehalem CPU, TLS exits 78: %s\n' "$err"
    fi
fi

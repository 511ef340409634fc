#!/usr/bin/env bash
# kafka-lock in one minute, on a throw-away local Apache Kafka broker:
#
#   1. contention  three `kafka-lock run` contenders ask for one lock; one job runs, the others say
#                  whom they wait for
#   2. status      `kafka-lock status` while someone holds the lock
#   3. handover    the holder's job ends, the lock is released, the next contender acquires
#   4. failover    the next holder's kafka-lock "crashes" (SIGKILL): its supervisor stops the job
#                  at once, and about a session timeout later the last contender acquires
#   5. tokens      the fencing tokens the jobs saw, in order: they strictly increase
#
# The broker is Apache Kafka 4.1.2 (KRaft, one JVM on loopback, scripts/local_kafka.py) with its
# default settings for groups, so the first acquisition shows what users of a stock cluster get:
# group.initial.rebalance.delay.ms=3000 holds the first join of an empty group for 3 s.
#
# Needs only what the project's machines ship (Rust, a JDK 17+, Maven, Python 3 with pip) and
# network access to crates.io, Maven Central and PyPI: it installs the broker jars into .tools/
# and builds the CLI first. Everything it starts listens on or talks to 127.0.0.1 only, and
# everything it starts is stopped when it ends, also on Ctrl-C or on an error.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

LOCK="nightly-report"
# Short timeouts so a crashed holder blocks the lock for seconds, not the default 10 s.
SESSION="6s"
HEARTBEAT="500ms"
KILL_GRACE="2s"

step() { printf '\n==> %s\n' "$*"; }
die() { printf 'demo: ERROR: %s\n' "$*" >&2; exit 1; }

workdir=$(mktemp -d "${TMPDIR:-/tmp}/kafka-lock-demo.XXXXXX")
broker_pid=""
orchestrator_pid=""

cleanup() {
    local status=$?
    trap - EXIT INT TERM
    # The orchestrator stops the contenders it started (SIGTERM: each passes it on to its job and
    # releases the lock), so it goes first; the broker goes last.
    if [[ -n "$orchestrator_pid" ]] && kill -0 "$orchestrator_pid" 2>/dev/null; then
        kill -TERM "$orchestrator_pid" 2>/dev/null || true
        wait "$orchestrator_pid" 2>/dev/null || true
    fi
    if [[ -n "$broker_pid" ]] && kill -0 "$broker_pid" 2>/dev/null; then
        # The launcher SIGKILLs the broker's JVM (throw-away data) and removes its files.
        kill -TERM "$broker_pid" 2>/dev/null || true
        wait "$broker_pid" 2>/dev/null || true
    fi
    if [[ $status -ne 0 && $status -ne 130 && $status -ne 143 && -s "$workdir/broker.log" ]]; then
        printf 'demo: the broker launcher said:\n' >&2
        tail -n 20 "$workdir/broker.log" | sed 's/^/    /' >&2
    fi
    rm -rf "$workdir"
    exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

step "Installing the Apache Kafka broker jars into .tools/ (skipped when already there)"
scripts/install-test-deps.sh 2>&1 | sed 's/^/    /'

step "Building kafka-lock (cargo build --release --features cli; the first build takes a few minutes)"
cargo build --quiet --release --features cli --bin kafka-lock
kafka_lock="${CARGO_TARGET_DIR:-$repo/target}/release/kafka-lock"
[[ -x "$kafka_lock" ]] || die "the build did not produce $kafka_lock"

step "Starting a private broker: Apache Kafka 4.1.2, one node, default group settings"
# The launcher prints the bootstrap address once FindCoordinator works, and stops the broker
# when its stdin closes (this script exits) or when it gets SIGTERM.
coproc BROKER { exec python3 scripts/local_kafka.py --initial-delay-ms 3000 2>>"$workdir/broker.log"; }
broker_pid=$BROKER_PID
bootstrap=""
while IFS= read -r -t 180 line <&"${BROKER[0]}"; do
    case "$line" in
        bootstrap=*) bootstrap=${line#bootstrap=} ;;
        started_s=*) printf '    ready after %s s\n' "${line#started_s=}"; break ;;
    esac
done
[[ -n "$bootstrap" ]] || die "the broker did not start"
printf '    Apache Kafka (launcher pid %s) listens on %s\n' "$broker_pid" "$bootstrap"

python3 - "$kafka_lock" "$bootstrap" "$LOCK" "$SESSION" "$HEARTBEAT" "$KILL_GRACE" <<'PY' &
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

KAFKA_LOCK, BOOTSTRAP, LOCK, SESSION, HEARTBEAT, KILL_GRACE = sys.argv[1:7]
NAMES = ["alice", "bob", "carol"]
JOB = 'echo "job by $KAFKA_LOCK_MEMBER_ID holds token $KAFKA_LOCK_TOKEN"; sleep 8'
PHASE_TIMEOUT = 40.0  # seconds; generous against a 6 s session and the broker's 3 s first-join delay
CRASH_AFTER = 2.0  # seconds into the second holder's job

stopping = False


def on_signal(signum, frame):
    # The first signal unwinds into the cleanup; later ones must not interrupt it.
    global stopping
    if not stopping:
        stopping = True
        raise KeyboardInterrupt


signal.signal(signal.SIGINT, on_signal)
signal.signal(signal.SIGTERM, on_signal)

T0 = time.monotonic()


def mono_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def say(who, text):
    print(f"[{time.monotonic() - T0:5.1f}s] {who:<6} {text}", flush=True)


def note(text):
    print(f"         {text}", flush=True)


def step(text):
    print(f"\n==> {text}", flush=True)


class Failure(Exception):
    pass


def die_with_parent():
    # If this script dies without cleaning up, its contenders get SIGTERM (they pass it on to
    # their jobs and release the lock) instead of running on.
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except Exception:
        pass


events = queue.Queue()


class Contender:
    def __init__(self, name):
        self.name = name
        self.proc = subprocess.Popen(
            [KAFKA_LOCK, "run", "--bootstrap", BOOTSTRAP, "--lock", LOCK,
             "--session-timeout", SESSION, "--heartbeat-interval", HEARTBEAT,
             "--kill-grace", KILL_GRACE, "--label", name, "--events", "json",
             "--", "sh", "-c", JOB],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, bufsize=1,
            # Its own process group: Ctrl-C reaches this script, which stops them in order.
            process_group=0, preexec_fn=die_with_parent)
        self.child_pid = None
        self.member_id = None
        self.token = None
        self.waiting_for = None
        self.crashed = False
        # Killed with SIGKILL (by the crash, or because it would not stop): its job may live on.
        self.killed = False
        self.exit_reported = False
        self.started_ns = mono_ns()

    def start_readers(self):
        threading.Thread(target=self._read, args=(self.proc.stdout, "job"), daemon=True).start()
        threading.Thread(target=self._read, args=(self.proc.stderr, "err"), daemon=True).start()

    def _read(self, stream, kind):
        for line in stream:
            line = line.rstrip("\n")
            if kind == "err" and line.startswith("{"):
                try:
                    events.put((self, "event", json.loads(line)))
                    continue
                except ValueError:
                    pass
            events.put((self, kind, line))
        events.put((self, "eof-" + kind, None))


contenders = []
holders = []  # (contender, token, job start mono_ns, job end mono_ns or None)
by_member = {}


def label_of(member_id):
    c = by_member.get(member_id)
    return c.name if c else member_id


def handle(c, kind, item):
    """Prints one thing a contender said and returns the event name, if it was an event."""
    if kind == "job":
        say(c.name, f"| {item}")
        return None
    if kind == "err":
        say(c.name, f"kafka-lock: {item}")
        return None
    if kind.startswith("eof"):
        if kind == "eof-err" and not c.exit_reported:
            c.exit_reported = True
            status = c.proc.wait()
            if c.crashed:
                say(c.name, f"kafka-lock was killed (signal {-status})")
            else:
                say(c.name, f"kafka-lock exited with status {status}")
        return kind
    ev = item
    name = ev.get("event")
    if ev.get("member_id"):
        c.member_id = ev["member_id"]
        by_member[c.member_id] = c
    if name == "waiting":
        holder = ev.get("holder")
        if holder and holder.get("member_id") != c.waiting_for:
            c.waiting_for = holder.get("member_id")
            who = holder.get("label") or holder.get("member_id")
            pos = ev.get("position")
            place = "next in line" if pos == 1 else f"position {pos} in line"
            say(c.name, f"waits: the lock is held by {who} (token {holder.get('token')}); {place}")
    elif name == "acquired":
        c.token = ev.get("token")
        c.waiting_for = None
        say(c.name, f"ACQUIRED the lock, token {c.token}")
    elif name == "child_started":
        c.child_pid = ev.get("child_pid")
        holders.append([c, c.token, ev.get("mono_ns"), None])
    elif name == "child_exited":
        for h in holders:
            if h[0] is c and h[3] is None:
                h[3] = ev.get("mono_ns")
        how = (f"exit {ev.get('exit_code')}" if ev.get("signal") is None
               else f"signal {ev.get('signal')}")
        say(c.name, f"job finished ({how})")
    elif name == "released":
        say(c.name, "released the lock")
    elif name == "lost":
        say(c.name, f"LOST the lock: {ev.get('detail') or ev.get('reason')}")
    return name


def wait_for(pred, what, timeout=PHASE_TIMEOUT):
    """Handles events until pred(contender, event name, event) is true; returns (c, event)."""
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise Failure(f"timed out after {timeout:.0f} s waiting for {what}")
        try:
            c, kind, item = events.get(timeout=left)
        except queue.Empty:
            continue
        name = handle(c, kind, item)
        if pred(c, name, item if kind == "event" else None):
            return c, item


def pump(seconds):
    """Handles events for a while (used only to give the demo a human pace)."""
    deadline = time.monotonic() + seconds
    while (left := deadline - time.monotonic()) > 0:
        try:
            c, kind, item = events.get(timeout=left)
        except queue.Empty:
            return
        handle(c, kind, item)


def stop_all():
    for c in contenders:
        if c.proc.poll() is None:
            try:
                c.proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 10
    for c in contenders:
        try:
            c.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.killed = True
            c.proc.kill()
            c.proc.wait()
        # kafka-lock's supervisor stops the job of a killed kafka-lock; this only makes sure.
        if c.killed and c.child_pid:
            try:
                os.killpg(c.child_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def main():
    step(f'1. Contention: alice, bob and carol run `kafka-lock run --lock {LOCK} -- <job>` at once')
    note(f"(session timeout {SESSION}, heartbeat {HEARTBEAT}; job: {JOB})")
    for name in NAMES:
        contenders.append(Contender(name))
    for c in contenders:
        c.start_readers()
        say(c.name, f"started kafka-lock (pid {c.proc.pid})")

    first, got = wait_for(lambda c, n, e: n == "acquired", "the first holder")
    note(f"the first acquisition took {(got['mono_ns'] - first.started_ns) / 1e9:.1f} s: the lock's "
         f"group was empty, so Apache Kafka held the first join for group.initial.rebalance.delay.ms")
    note("(3 s by default), and again for each member that arrived meanwhile, up to the rebalance")
    note(f"timeout ({SESSION}); a lone contender on an empty group waits the 3 s once")
    others = [c for c in contenders if c is not first]
    # Let the other two report whom they wait for before asking `status`.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(o.waiting_for for o in others):
        pump(0.2)

    step(f"2. `kafka-lock status --lock {LOCK}` while {first.name} holds it")
    out = subprocess.run([KAFKA_LOCK, "status", "--bootstrap", BOOTSTRAP, "--lock", LOCK],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    for line in (out.stdout + out.stderr).splitlines():
        print(f"    {line}")

    step(f"3. Handover: {first.name}'s job ends, kafka-lock releases the lock, a waiter acquires")
    _, released = wait_for(lambda c, n, e: c is first and n == "released",
                           f"{first.name} to release the lock")
    second, acquired = wait_for(lambda c, n, e: n == "acquired", "the second holder")
    note(f"handover took {(acquired['mono_ns'] - released['mono_ns']) * 1000 / 1e9:.0f} ms: the "
         f"waiter first in line heartbeats every quarter interval, learns of the release and rejoins")

    step(f"4. Crash: {second.name}'s kafka-lock is killed mid-job (SIGKILL)")
    wait_for(lambda c, n, e: c is second and n == "child_started", f"{second.name}'s job")
    pump(CRASH_AFTER)
    crash_ns = mono_ns()
    second.crashed = True
    second.killed = True
    os.kill(second.proc.pid, signal.SIGKILL)
    say(second.name, f"CRASH: killed kafka-lock (pid {second.proc.pid}), nothing else")
    # The job is stopped by kafka-lock's supervisor process, which notices that kafka-lock is
    # gone; the demo only watches it die.
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and os.path.exists(f"/proc/{second.child_pid}"):
        pump(0.02)
    if os.path.exists(f"/proc/{second.child_pid}"):
        raise Failure(f"{second.name}'s job (pid {second.child_pid}) still runs 5 s after the crash")
    gone_ns = mono_ns()
    for h in holders:
        if h[0] is second and h[3] is None:
            h[3] = gone_ns
    say(second.name, f"its job (pid {second.child_pid}) was stopped by kafka-lock's supervisor "
                     f"{(gone_ns - crash_ns) / 1e6:.0f} ms after the crash")
    note(f"nobody releases the lock now: the broker must notice that {second.name} went silent")
    third, acquired = wait_for(lambda c, n, e: n == "acquired", "the third holder")
    note(f"failover took {(acquired['mono_ns'] - crash_ns) / 1e9:.1f} s after the crash "
         f"(the broker drops a silent member after the session timeout, {SESSION}; then one rebalance)")
    wait_for(lambda c, n, e: c is third and n == "released", f"{third.name} to release the lock")
    for c in contenders:
        if not c.exit_reported:
            wait_for(lambda c2, n, e: c2 is c and n == "eof-err", f"{c.name}'s kafka-lock to exit",
                     timeout=10)

    step("5. Fencing tokens, in the order the jobs ran")
    ok = True
    for i, (c, token, start, end) in enumerate(holders):
        print(f"    {c.name:<6} token {token}")
        if i > 0:
            prev = holders[i - 1]
            if not token > prev[1]:
                ok = False
            if prev[3] is None or start < prev[3]:
                ok = False
                note(f"!! {c.name}'s job started before {prev[0].name}'s had ended")
    tokens = " < ".join(str(h[1]) for h in holders)
    if ok and len(holders) == 3:
        print(f"    {tokens}: strictly increasing, and no two jobs ever ran at once.")
        note("(a token is the group's generation; every membership change bumps it, so it can")
        note(" skip numbers; a store that rejects writes with a token lower than one it has seen")
        note(" fences off a holder that lost the lock without knowing it)")
        return 0
    print(f"    UNEXPECTED: tokens {tokens} from {len(holders)} jobs")
    return 1


status = 1
try:
    status = main()
except Failure as e:
    print(f"demo: ERROR: {e}", file=sys.stderr, flush=True)
except KeyboardInterrupt:
    print("\ndemo: interrupted", file=sys.stderr, flush=True)
    status = 130
finally:
    stopping = True
    stop_all()
sys.exit(status)
PY
orchestrator_pid=$!
status=0
wait "$orchestrator_pid" || status=$?
orchestrator_pid=""
[[ $status -eq 0 ]] || exit "$status"

step "Done: the three contenders and the broker are stopped."

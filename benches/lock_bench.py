#!/usr/bin/env python3
"""Lock benchmark on Apache Kafka: kafka-lock side by side with the seed design on the Java
KafkaConsumer (tests/java/SeedLockPeer.java) and on librdkafka (tests/interop/rdkafka_lock.py),
same broker, same timeouts (session 6 s, heartbeat 1 s unless told otherwise).

Scenarios (each on fresh groups, --reps times, medians reported):
  uncontended        process start -> holding, on a broker with group.initial.rebalance.delay.ms=0;
                     for kafka-lock the CLI: process start -> the command started
  uncontended-3s     the same on a broker with Kafka's default delay of 3000 ms
  handover           A holds, B waits; at a random moment 1-2 s later A is asked to release;
                     time from that request to B holding
  failover           the same, but A is SIGKILLed; time from the kill to B holding
  herd               kafka-lock only: --herd contenders start together and pass the lock one by one,
                     each holding 1 s; handover gaps, members that dropped out, and the requests
                     per second the coordinator received (counted by a proxy the broker advertises)
  coordinator        kafka-lock only, 3-node cluster: SIGKILL of the lock group's coordinator while
                     A holds and B waits; time from the kill until the new coordinator renewed A's
                     lease, and whether A kept the lock
  ledger-acquire     kafka-lock only: acquire() called -> holding, uncontended, without a ledger
                     and with one (the ACQUIRED append, acks=all, is the difference)
  handover-many      kafka-lock only: handover as above, side by side with the same where A's and
                     B's processes each hold --also-hold (default 1000) other locks through the one
                     client they contend through (contender --also-hold; heartbeat 3 s for those)
  ledger-handover    kafka-lock only: A holds, N waiters (--waiters, default 1,50) wait; at a random
                     moment 1-2 s after all are waiting A releases; time from that request to the
                     first waiter holding. Without a ledger, with a ledger and push (waiters
                     long-poll it), with a ledger and no push

Every time comes from CLOCK_MONOTONIC readings by the processes themselves (their events carry it;
Java's System.nanoTime is CLOCK_MONOTONIC on Linux) or by this script just before it acts.

    scripts/install-test-deps.sh
    cargo build --release --features cli --bin kafka-lock --example contender
    python3 benches/lock_bench.py [--reps 5] [--only uncontended,handover,...] [--json FILE]
    python3 benches/lock_bench.py --quick [--only ...]   # a smoke run: 1 rep, a herd of 10, 1 and
                                                         # 5 waiters

Only loopback addresses are used; every process it starts is stopped when it ends.
"""

import argparse
import asyncio
import json
import os
import queue
import random
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from local_kafka import JAVA, LIBS, LocalKafka, free_ports  # noqa: E402

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
KAFKA_LOCK = TARGET / "release/kafka-lock"
# Another build of the library contender can be measured in its place (e.g. an older commit's).
CONTENDER = Path(os.environ.get("KAFKA_LOCK_CONTENDER", TARGET / "release/examples/contender"))
PYTHON = Path(os.environ.get("KAFKA_LOCK_PYTHON", ROOT / ".tools/venv/bin/python"))
RDKAFKA = ROOT / "tests/interop/rdkafka_lock.py"
JAVA_PEER = ROOT / "tests/java/SeedLockPeer.java"
BOUND = 90.0


def mono_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


def die_with_parent():
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except Exception:
        pass


def run_admin(bootstrap, *args):
    subprocess.run([JAVA, "-cp", f"{LIBS}/*", str(ROOT / "tests/java/KafkaAdmin.java"),
                    bootstrap, *args], check=True, capture_output=True, text=True)


def create_topic(bootstrap, name):
    run_admin(bootstrap, "create-topic", name, "1")


class Proc:
    """A process printing one event per line; events are parsed by `parse` into (name, mono_ns)."""

    def __init__(self, argv, parse, stream="stdout", stdin=True):
        self.spawned_ns = mono_ns()
        self.proc = subprocess.Popen(
            argv, stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1,
            preexec_fn=die_with_parent)
        self.parse = parse
        self.events = queue.Queue()
        self.log = []
        src = self.proc.stdout if stream == "stdout" else self.proc.stderr
        other = self.proc.stderr if stream == "stdout" else self.proc.stdout
        threading.Thread(target=self._read, args=(src,), daemon=True).start()
        threading.Thread(target=lambda: [None for _ in other], daemon=True).start()

    def _read(self, stream):
        for line in stream:
            ev = self.parse(line.strip())
            if ev:
                self.events.put(ev)

    def wait(self, names, bound=BOUND):
        """The next event named in `names`. A process that exits first (the contender exits with
        74 when it loses the lock, possibly before its `lost` line is out) gives an `exited`
        event if `names` has it, else ends the run."""
        deadline = time.monotonic() + bound
        while True:
            left = deadline - time.monotonic()
            try:
                ev = self.events.get(timeout=max(0.0, min(left, 0.2)))
            except queue.Empty:
                rc = self.proc.poll()
                if rc is not None and self.events.empty():
                    if "exited" in names:
                        return ("exited", mono_ns(), {"returncode": rc})
                    raise SystemExit(f"exited with {rc} while waiting for {names}; saw {self.log}")
                if left <= 0:
                    raise SystemExit(f"timed out waiting for {names}; saw {self.log}")
                continue
            self.log.append(ev)
            if ev[0] in names:
                return ev

    def send(self, line):
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
        except (BrokenPipeError, OSError):
            pass

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self, release):
        if self.proc.poll() is None:
            self.send(release)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()


def parse_json(line):
    try:
        e = json.loads(line)
    except ValueError:
        return None
    return (e.get("event"), int(e.get("mono_ns", 0)), e)


def parse_java(line):
    parts = line.split()
    if len(parts) >= 2 and parts[1].isdigit():
        return (parts[0].lower(), int(parts[1]), parts)
    return None


class KafkaLockLib:
    name = "kafka-lock (library)"
    held, release = "acquired", "close"

    def __init__(self, session_ms, heartbeat_ms):
        self.session_ms, self.heartbeat_ms = session_ms, heartbeat_ms

    def start(self, bootstrap, group, topic, client_id):
        return Proc([str(CONTENDER), bootstrap, group, "--session-ms", str(self.session_ms),
                     "--heartbeat-ms", str(self.heartbeat_ms)], parse_json)


class KafkaLockLedger(KafkaLockLib):
    """The library contender with a ledger topic; `push` turns the waiters' long poll on or off."""

    def __init__(self, session_ms, heartbeat_ms, ledger, push):
        super().__init__(session_ms, heartbeat_ms)
        self.ledger, self.push = ledger, push
        self.name = f"kafka-lock (ledger, push {'on' if push else 'off'})"

    def start(self, bootstrap, group, topic, client_id):
        return Proc([str(CONTENDER), bootstrap, group, "--session-ms", str(self.session_ms),
                     "--heartbeat-ms", str(self.heartbeat_ms), "--ledger-topic", self.ledger,
                     "--push", "on" if self.push else "off"], parse_json)


class KafkaLockLibMany(KafkaLockLib):
    """The library contender in a process that holds `n` other locks through the same client."""

    def __init__(self, session_ms, heartbeat_ms, n):
        super().__init__(session_ms, heartbeat_ms)
        self.n = n
        self.name = f"kafka-lock (library, {n} other locks held)"

    def start(self, bootstrap, group, topic, client_id):
        return Proc([str(CONTENDER), bootstrap, group, "--session-ms", str(self.session_ms),
                     "--heartbeat-ms", str(self.heartbeat_ms), "--also-hold", str(self.n)], parse_json)


class KafkaLockCli:
    """The product: `kafka-lock run`; holding = the command started."""
    name = "kafka-lock (CLI)"
    held, release = "child_started", ""

    def __init__(self, session_ms, heartbeat_ms):
        self.session_ms, self.heartbeat_ms = session_ms, heartbeat_ms

    def start(self, bootstrap, group, topic, client_id):
        return Proc([str(KAFKA_LOCK), "run", "--bootstrap", bootstrap, "--lock", group,
                     "--session-timeout", f"{self.session_ms}ms",
                     "--heartbeat-interval", f"{self.heartbeat_ms}ms", "--events", "json",
                     "--", "true"], parse_json, stream="stderr", stdin=False)


class JavaSeed:
    name = "Java KafkaConsumer (seed design)"
    held, release = "acquired", "quit"
    classes = None

    def __init__(self, session_ms, heartbeat_ms):
        self.session_ms, self.heartbeat_ms = session_ms, heartbeat_ms
        if JavaSeed.classes is None:
            # Compiled once, as a user's application would be: the source launcher would add a
            # compilation to every start.
            JavaSeed.classes = tempfile.mkdtemp(prefix="kafka-lock-bench-java-")
            subprocess.run(["javac", "-cp", f"{LIBS}/*", "-d", JavaSeed.classes, str(JAVA_PEER)],
                           check=True)

    def start(self, bootstrap, group, topic, client_id):
        return Proc([JAVA, "-cp", f"{LIBS}/*:{JavaSeed.classes}",
                     f"-Dlog4j2.configurationFile={ROOT / 'tests/java/log4j2.properties'}",
                     "SeedLockPeer", "--bootstrap", bootstrap, "--group", group, "--topic", topic,
                     "--client-id", client_id, "--session-timeout-ms", str(self.session_ms),
                     "--heartbeat-interval-ms", str(self.heartbeat_ms)], parse_java)


def parse_rdkafka(line):
    ev = parse_json(line)
    # Every member gets an `assigned` callback; only partition 0 is the lock.
    if ev and ev[0] == "assigned" and 0 in ev[2].get("partitions", []):
        return ("acquired", ev[1], ev[2])
    return ev


class Rdkafka:
    name = "librdkafka consumer (seed design)"
    held, release = "acquired", "close"

    def __init__(self, session_ms, heartbeat_ms):
        self.session_ms, self.heartbeat_ms = session_ms, heartbeat_ms

    def start(self, bootstrap, group, topic, client_id):
        return Proc([str(PYTHON), str(RDKAFKA), bootstrap, group, topic, client_id,
                     str(self.session_ms), str(self.heartbeat_ms)], parse_rdkafka)


def acquire_cost(kafka, client, _rep):
    """acquire() called (the contender's `started`) -> holding, in the contender's own clock."""
    group = fresh(kafka, client, "cost")
    p = client.start(kafka.bootstrap, group, group, "a")
    try:
        started = p.wait({"started"})
        ev = p.wait({client.held})
        return (ev[1] - started[1]) / 1e9
    finally:
        p.stop(client.release)


def handover_n(kafka, client, rep, n):
    """A holds, n waiters wait; A releases at a random moment; time to the first new holder."""
    group = fresh(kafka, client, f"h{n}")
    a = client.start(kafka.bootstrap, group, group, "a")
    waiters = []
    try:
        a.wait({client.held})
        merged = queue.Queue()
        for i in range(n):
            w = client.start(kafka.bootstrap, group, group, f"w{i}")
            waiters.append(w)

            def forward(i=i, w=w):
                while True:
                    merged.put((i, w.events.get()))

            threading.Thread(target=forward, daemon=True).start()
        waiting = set()
        deadline = time.monotonic() + BOUND * 4
        while len(waiting) < n:
            i, ev = merged.get(timeout=max(0.0, deadline - time.monotonic()))
            if ev[0] == "waiting":
                waiting.add(i)
        time.sleep(random.Random(rep).uniform(1.0, 2.0))
        while not merged.empty():
            merged.get_nowait()
        at = mono_ns()
        a.send(client.release)
        while True:
            i, ev = merged.get(timeout=BOUND)
            if ev[0] == client.held:
                return (ev[1] - at) / 1e9
    finally:
        # A waiter reads its stdin only once it holds, so asking each to close would pass the
        # lock down the whole queue first; the group is thrown away anyway.
        for p in [a, *waiters]:
            if p.proc.poll() is None:
                p.proc.kill()
        for p in [a, *waiters]:
            p.proc.wait()


def needs_topic(client):
    return not isinstance(client, (KafkaLockLib, KafkaLockCli))


def fresh(kafka, client, tag):
    group = f"bench-{tag}-{uuid.uuid4().hex[:8]}"
    if needs_topic(client):
        create_topic(kafka.bootstrap, group)
    return group


def uncontended(kafka, client, _rep):
    group = fresh(kafka, client, "solo")
    p = client.start(kafka.bootstrap, group, group, "a")
    try:
        ev = p.wait({client.held})
        return (ev[1] - p.spawned_ns) / 1e9
    finally:
        p.stop(client.release) if client.release else p.kill()


def pair(kafka, client, rep, act):
    group = fresh(kafka, client, "pair")
    a = client.start(kafka.bootstrap, group, group, "a")
    b = None
    try:
        a.wait({client.held})
        b = client.start(kafka.bootstrap, group, group, "b")
        # B has joined and synced: for kafka-lock a waiting event; the seed clients say nothing
        # while unassigned, so give B the time a join takes before the random moment.
        if isinstance(client, KafkaLockLib):
            b.wait({"waiting"})
        else:
            time.sleep(1.0)
        time.sleep(random.Random(rep).uniform(1.0, 2.0))
        at = mono_ns()
        act(a)
        ev = b.wait({client.held})
        return (ev[1] - at) / 1e9
    finally:
        for p in (a, b):
            if p:
                p.stop(client.release)


def handover(kafka, client, rep):
    return pair(kafka, client, rep, lambda a: a.send(client.release))


def failover(kafka, client, rep):
    return pair(kafka, client, rep, lambda a: a.kill())


# ---- herd: many waiters, requests counted at a proxy the broker advertises ------------------


class CountingProxy:
    """Forwards 127.0.0.1:port to the broker and counts the requests per API key."""

    def __init__(self, port):
        self.port, self.target = port, None
        self.counts = {}
        self.lock = threading.Lock()
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        asyncio.run_coroutine_threadsafe(self._serve(), self.loop).result()

    async def _serve(self):
        self.server = await asyncio.start_server(self._conn, "127.0.0.1", self.port)

    async def _conn(self, r, w):
        ur, uw = await asyncio.open_connection("127.0.0.1", self.target)

        async def upstream():
            buf = b""
            while data := await r.read(65536):
                uw.write(data)
                buf += data
                while len(buf) >= 6:
                    size = struct.unpack(">i", buf[:4])[0]
                    if len(buf) < 4 + size:
                        break
                    api = struct.unpack(">h", buf[4:6])[0]
                    with self.lock:
                        self.counts[api] = self.counts.get(api, 0) + 1
                    buf = buf[4 + size:]
            uw.close()

        async def downstream():
            while data := await ur.read(65536):
                w.write(data)
            w.close()

        await asyncio.gather(upstream(), downstream(), return_exceptions=True)

    def snapshot(self):
        with self.lock:
            return dict(self.counts)


API_NAMES = {0: "Produce", 1: "Fetch", 3: "Metadata", 10: "FindCoordinator", 11: "JoinGroup",
             12: "Heartbeat", 13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups",
             18: "ApiVersions"}


def herd(n, session_ms, heartbeat_ms):
    proxy_port, = free_ports(1)
    proxy = CountingProxy(proxy_port)
    with LocalKafka(initial_delay_ms=0,
                    extra={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{proxy_port}"}) as kafka:
        proxy.target = kafka.nodes[0].port
        bootstrap = f"127.0.0.1:{proxy_port}"
        client = KafkaLockLib(session_ms, heartbeat_ms)
        group = f"bench-herd-{uuid.uuid4().hex[:8]}"
        procs = [client.start(bootstrap, group, group, f"m{i}") for i in range(n)]
        merged = queue.Queue()

        def forward(i, p):
            while True:
                merged.put((i, p.events.get()))

        for i, p in enumerate(procs):
            threading.Thread(target=forward, args=(i, p), daemon=True).start()
        before, t0 = proxy.snapshot(), mono_ns()
        acquired, released, lost = {}, {}, []
        gaps = []
        deadline = time.monotonic() + BOUND * 10
        holder = None
        release_at = None
        while len(released) < n and time.monotonic() < deadline:
            if holder is not None and time.monotonic() >= release_at:
                procs[holder].send("close")
                holder = None
            try:
                i, ev = merged.get(timeout=0.05)
            except queue.Empty:
                continue
            if ev[0] == "acquired":
                if i in acquired:
                    lost.append(f"member {i} acquired twice")
                acquired[i] = ev[1]
                if released:
                    gaps.append((ev[1] - max(released.values())) / 1e9)
                holder, release_at = i, time.monotonic() + 1.0
            elif ev[0] == "released":
                released[i] = ev[1]
            elif ev[0] == "lost":
                lost.append(f"member {i} lost: {ev[2]}")
        t1 = mono_ns()
        after = proxy.snapshot()
        for p in procs:
            p.stop("close")
        seconds = (t1 - t0) / 1e9
        rates = {API_NAMES.get(k, str(k)): (after.get(k, 0) - before.get(k, 0)) / seconds
                 for k in after}
        return {
            "members": n, "acquired": len(acquired), "dropped_or_lost": lost,
            "handover_median_s": statistics.median(gaps) if gaps else None,
            "handover_max_s": max(gaps) if gaps else None,
            "seconds": seconds,
            "requests_per_s": {k: round(v, 1) for k, v in sorted(rates.items())},
            "requests_per_s_total": round(sum(rates.values()), 1),
        }


# ---- coordinator failover on three nodes ----------------------------------------------------


def coordinator_failover(reps, session_ms, heartbeat_ms):
    out = []
    with LocalKafka(nodes=3, initial_delay_ms=0) as cluster:
        client = KafkaLockLib(session_ms, heartbeat_ms)
        for rep in range(reps):
            group = f"bench-coord-{rep}-{uuid.uuid4().hex[:6]}"
            a = client.start(cluster.bootstrap, group, group, "a")
            a.wait({"acquired"})
            b = client.start(cluster.bootstrap, group, group, "b")
            b.wait({"waiting"})
            a.wait({"renewed"})
            victim = cluster.coordinator_of(group)
            time.sleep(random.Random(rep).uniform(0.0, heartbeat_ms / 1000))
            killed = mono_ns()
            cluster.kill(victim)
            # A renews every heartbeat, so renewals from before the kill may still be queued.
            outcome = {"renewed", "lost", "exited"}
            ev = a.wait(outcome, bound=session_ms / 1000 * 4)
            while ev[0] == "renewed" and ev[1] <= killed:
                ev = a.wait(outcome, bound=session_ms / 1000 * 4)
            kept = ev[0] == "renewed"
            out.append({"confirmed_after_s": (ev[1] - killed) / 1e9 if kept else None,
                        "kept": kept, "outcome": ev[0], "after_s": (ev[1] - killed) / 1e9,
                        "killed_node": victim})
            for p in (a, b):
                p.stop("close")
            cluster.start_node(cluster.node(victim))
            cluster.wait_ready()
    return out


SCENARIOS = ["uncontended", "uncontended-3s", "handover", "failover", "herd", "coordinator",
             "ledger-acquire", "ledger-handover", "handover-many"]


def summary(samples):
    return {"median": statistics.median(samples), "min": min(samples), "max": max(samples),
            "runs": [round(s, 3) for s in samples]}


def main():
    ap = argparse.ArgumentParser(description="kafka-lock vs the seed design on Apache Kafka")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--herd", type=int, default=50)
    ap.add_argument("--waiters", default="1,50", help="ledger-handover: waiter counts")
    ap.add_argument("--also-hold", type=int, default=1000, help="handover-many: other locks held")
    ap.add_argument("--only", default=",".join(SCENARIOS))
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run that only shows every scenario works: --reps 1 --herd 10 "
                    "--waiters 1,5")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.quick:
        args.reps, args.herd, args.waiters = 1, 10, "1,5"
    unknown = set(args.only.split(",")) - set(SCENARIOS)
    if unknown:
        ap.error(f"unknown scenario(s) {', '.join(sorted(unknown))}; known: {', '.join(SCENARIOS)}")
    only = set(args.only.split(","))
    # The CLI binary only for the scenarios that run it.
    needed = [CONTENDER, *([KAFKA_LOCK] if only & {"uncontended", "uncontended-3s"} else [])]
    for f in needed:
        if not f.exists():
            raise SystemExit(f"{f} missing: cargo build --release --features cli --bin kafka-lock --example contender")
    s, h = args.session_ms, args.heartbeat_ms
    results = {"settings": {"session_ms": s, "heartbeat_ms": h, "reps": args.reps}}

    def table(title, kafka, clients, scenario):
        rows = {}
        for c in clients:
            runs = [scenario(kafka, c, rep) for rep in range(args.reps)]
            rows[c.name] = summary(runs)
            print(f"{title:<16} {c.name:<36} median {rows[c.name]['median']:.3f} s  runs {rows[c.name]['runs']}",
                  flush=True)
        results[title] = rows

    def interleaved(title, kafka, clients, scenario, reps):
        """Like `table`, but one untimed run per client first (the broker's JIT, the leader's
        connections) and the clients taking turns, so a change of load hits them alike."""
        for c in clients:
            scenario(kafka, c, -1)
        runs = {c.name: [] for c in clients}
        for rep in range(reps):
            for c in clients:
                runs[c.name].append(scenario(kafka, c, rep))
        rows = {}
        for c in clients:
            rows[c.name] = summary(runs[c.name])
            print(f"{title:<18} {c.name:<36} median {rows[c.name]['median'] * 1000:.1f} ms  runs "
                  f"{[round(x * 1000, 1) for x in runs[c.name]]}", flush=True)
        results[title] = rows

    seeds = [JavaSeed(s, h), Rdkafka(s, h)]
    if only & {"uncontended", "handover", "failover"}:
        with LocalKafka(initial_delay_ms=0) as kafka:
            if "uncontended" in only:
                table("uncontended", kafka, [KafkaLockCli(s, h), KafkaLockLib(s, h), *seeds], uncontended)
            if "handover" in only:
                table("handover", kafka, [KafkaLockLib(s, h), *seeds], handover)
            if "failover" in only:
                table("failover", kafka, [KafkaLockLib(s, h), *seeds], failover)
    if "uncontended-3s" in only:
        with LocalKafka(initial_delay_ms=3000) as kafka:
            table("uncontended-3s", kafka, [KafkaLockCli(s, h), *seeds], uncontended)
    if only & {"ledger-acquire", "ledger-handover"}:
        with LocalKafka(initial_delay_ms=0) as kafka:
            ledger = f"bench-ledger-{uuid.uuid4().hex[:8]}"
            create_topic(kafka.bootstrap, ledger)
            lib = KafkaLockLib(s, h)
            on, off = KafkaLockLedger(s, h, ledger, True), KafkaLockLedger(s, h, ledger, False)
            if "ledger-acquire" in only:
                interleaved("ledger-acquire", kafka, [lib, on], acquire_cost, args.reps * 4)
            if "ledger-handover" in only:
                for n in [int(x) for x in args.waiters.split(",")]:
                    interleaved(f"ledger-handover-{n}", kafka, [lib, on, off],
                                lambda k, c, rep, n=n: handover_n(k, c, rep, n), args.reps)
    if "handover-many" in only:
        with LocalKafka(initial_delay_ms=0) as kafka:
            interleaved("handover-many", kafka, [KafkaLockLib(s, h), KafkaLockLibMany(s, h, args.also_hold)],
                        handover, args.reps)
    if "herd" in only:
        results["herd"] = herd(args.herd, s, h)
        print("herd", json.dumps(results["herd"]), flush=True)
    if "coordinator" in only:
        results["coordinator"] = coordinator_failover(args.reps, s, h)
        print("coordinator", json.dumps(results["coordinator"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Idle cost and start-up of one lock holder: `kafka-lock run -- sleep 70` against a librdkafka
holder (Python confluent-kafka, tests/interop/rdkafka_lock.py), on one private Apache Kafka node
(scripts/local_kafka.py, group.initial.rebalance.delay.ms=0 unless told otherwise), with the same
session timeout and heartbeat interval.

For each holder it measures:
  exec -> first request   CLOCK_MONOTONIC just before Popen, to the first byte the holder sends
                          to a loopback TCP proxy in this script (the broker advertises the
                          proxy's address, so every connection of the holder passes through it)
  idle CPU over 60 s      user + system CPU time of the holder process (not its children), from
                          /proc/<pid>/stat, between the moment it holds the lock and 60 s later;
                          /proc/<pid>/task/*/schedstat gives the same in nanoseconds
  peak RSS                VmHWM from /proc/<pid>/status, read just before the holder is stopped
  requests/s              requests per API key the proxy forwarded during the idle window

Each holder runs alone (one after the other), so they do not compete for the CPU. Start-up is
also sampled --startup-reps more times per holder (started, first request seen, stopped).

Usage (after scripts/install-test-deps.sh, `cargo build --release --features cli` and, for the
static binary, scripts/build-static.sh):

    python3 benches/idle_bench.py [--idle-seconds 60] [--session-ms 10000] [--heartbeat-ms 1000]
                                  [--startup-reps 10] [--initial-delay-ms 0] [--json FILE]
    python3 benches/idle_bench.py --quick     # a smoke run: 10 s idle, 2 start-up samples

Only loopback addresses are used, and every process it starts is stopped when it ends.
"""

import argparse
import json
import os
import platform
import queue
import signal
import socket
import statistics
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from local_kafka import JAVA, LIBS, LocalKafka  # noqa: E402

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
PYTHON = Path(os.environ.get("KAFKA_LOCK_PYTHON", ROOT / ".tools/venv/bin/python"))
RDKAFKA = ROOT / "tests/interop/rdkafka_lock.py"
BINARIES = {
    "kafka-lock (static musl)": TARGET / "x86_64-unknown-linux-musl/release/kafka-lock",
    "kafka-lock (glibc)": TARGET / "release/kafka-lock",
}
CLK_TCK = os.sysconf("SC_CLK_TCK")
BOUND = 60.0  # seconds to wait for a holder to hold, or for anything else to happen


def mono_ns():
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


try:
    import ctypes

    _prctl = ctypes.CDLL(None, use_errno=True).prctl
except (ImportError, OSError, AttributeError):
    _prctl = None


def die_with_parent():
    # If this script dies without cleaning up, what it started is stopped with it. It runs in the
    # child between fork and exec, i.e. inside the measured start-up: only one system call here.
    if _prctl is not None:
        _prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG


STARTED = []  # every Popen, so the final cleanup can stop whatever is left


def spawn(argv, **kw):
    proc = subprocess.Popen(argv, preexec_fn=die_with_parent, **kw)
    STARTED.append(proc)
    return proc


def stop(proc, sig=signal.SIGTERM, timeout=10):
    if proc.poll() is None:
        try:
            proc.send_signal(sig)
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        except ProcessLookupError:
            pass


API_NAMES = {0: "Produce", 1: "Fetch", 2: "ListOffsets", 3: "Metadata", 8: "OffsetCommit",
             9: "OffsetFetch", 10: "FindCoordinator", 11: "JoinGroup", 12: "Heartbeat",
             13: "LeaveGroup", 14: "SyncGroup", 15: "DescribeGroups", 18: "ApiVersions"}


class Broker:
    """One Apache Kafka node that advertises `proxy`'s address, so every connection of a holder
    (bootstrap and coordinator alike) goes through the proxy and is counted."""

    def __init__(self, proxy, initial_delay_ms):
        self.kafka = LocalKafka(initial_delay_ms=initial_delay_ms,
                                extra={"advertised.listeners": f"PLAINTEXT://{proxy.address}"})
        self.kafka.start()
        proxy.upstream = ("127.0.0.1", self.kafka.nodes[0].port)

    def create_topic(self, name):
        # Straight to the listener; the admin client then follows the advertised address through
        # the proxy, which is reset before the holder starts.
        subprocess.run([JAVA, "-cp", f"{LIBS}/*", str(ROOT / "tests/java/KafkaAdmin.java"),
                        self.kafka.nodes[0].address, "create-topic", name, "1"],
                       check=True, capture_output=True, timeout=120)

    def stop(self):
        self.kafka.stop()


class CountingProxy:
    """A loopback TCP proxy in front of the broker: notes when the first byte from a client
    arrives, and counts the requests it forwards per API key. reset() starts a new measurement.
    Everything is closed by close().
    """

    def __init__(self):
        self.upstream = None  # set once the broker listens
        self.first_byte_ns = None
        self.first = threading.Event()
        self.lock = threading.Lock()
        self.counts = {}
        self.sockets = []
        self.closed = False
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", 0))
        self.listener.listen(16)
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"

    def _accept(self):
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self.first_byte_ns is None:
                # Timestamp the first byte here, before connecting upstream, so the proxy's own
                # set-up does not count as the client's start-up. MSG_PEEK leaves it for the pump.
                try:
                    client.settimeout(BOUND)
                    if client.recv(1, socket.MSG_PEEK):
                        self._first(mono_ns())
                    client.settimeout(None)
                except OSError:
                    pass
            try:
                server = socket.create_connection(self.upstream, timeout=5)
                server.settimeout(None)
            except OSError:
                client.close()
                continue
            with self.lock:
                if self.closed:
                    client.close()
                    server.close()
                    return
                self.sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, src, dst, from_client):
        buf = b""
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if from_client and data:
                if self.first_byte_ns is None:
                    self._first(mono_ns())
                buf = self._count(buf + data)
            if not data:
                try:
                    dst.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                return
            try:
                dst.sendall(data)
            except OSError:
                return

    def _count(self, buf):
        """Counts every whole request frame in `buf` (size, then the API key); returns the rest."""
        while len(buf) >= 6:
            size = struct.unpack(">i", buf[:4])[0]
            if len(buf) < 4 + size:
                break
            api = struct.unpack(">h", buf[4:6])[0]
            with self.lock:
                self.counts[api] = self.counts.get(api, 0) + 1
            buf = buf[4 + size:]
        return buf

    def reset(self):
        with self.lock:
            self.first_byte_ns = None
            self.first.clear()
            self.counts = {}

    def snapshot(self):
        with self.lock:
            return dict(self.counts)

    def _first(self, now):
        with self.lock:
            if self.first_byte_ns is None:
                self.first_byte_ns = now
                self.first.set()

    def close(self):
        with self.lock:
            self.closed = True
            socks, self.sockets = self.sockets, []
        self.listener.close()
        for s in socks:
            try:
                s.close()
            except OSError:
                pass


def cpu_ticks(pid):
    """(user, system) CPU time of the process itself, in seconds, from /proc/<pid>/stat."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    # After the command name: state is field 3, utime field 14, stime field 15 (1-based).
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def cpu_ns(pid):
    """On-CPU time of all live threads of the process, in ns (schedstat; finer than ticks)."""
    total = 0
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return total


def cpu_ns_by_thread(pid):
    """On-CPU ns of each live thread, keyed by "name/tid"."""
    out = {}
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                name = f.read().strip()
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                out[f"{name}/{task}"] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def threads(pid):
    return len(os.listdir(f"/proc/{pid}/task"))


class Holder:
    """One lock-holder process and its JSON event lines."""

    def __init__(self, argv, events_on, stdin=subprocess.DEVNULL):
        self.events = queue.Queue()
        self.exec_ns = mono_ns()
        self.proc = spawn(argv, stdin=stdin,
                          stdout=subprocess.PIPE if events_on == "stdout" else subprocess.DEVNULL,
                          stderr=subprocess.PIPE if events_on == "stderr" else subprocess.DEVNULL,
                          text=True, bufsize=1)
        stream = self.proc.stdout if events_on == "stdout" else self.proc.stderr
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()
        self.seen = []

    def _read(self, stream):
        for line in stream:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass

    def wait_event(self, pred, what):
        deadline = time.monotonic() + BOUND
        while True:
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and self.events.empty():
                raise SystemExit(f"{what}: not seen (exit status {self.proc.poll()}); "
                                 f"events: {self.seen}")
            try:
                e = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            self.seen.append(e)
            if pred(e):
                return e

    def drain(self):
        while True:
            try:
                self.seen.append(self.events.get_nowait())
            except queue.Empty:
                return


class KafkaLockKind:
    def __init__(self, name, binary, args):
        self.name, self.binary, self.args = name, binary, args

    def start(self, bootstrap, group):
        return Holder([str(self.binary), "run", "--bootstrap", bootstrap, "--lock", group,
                       "--session-timeout", f"{self.args.session_ms}ms",
                       "--heartbeat-interval", f"{self.args.heartbeat_ms}ms",
                       "--events", "json", "--", "sleep", str(self.args.idle_seconds + 10)],
                      "stderr")

    def prepare(self, group):
        pass

    def held(self, e):
        return e.get("event") == "acquired"

    def lost(self, e):
        return e.get("event") in ("lost", "child_exited", "released")

    def stop(self, holder):
        # SIGTERM is passed on to `sleep`; kafka-lock releases the lock and exits.
        stop(holder.proc, signal.SIGTERM)


class RdkafkaKind:
    name = "librdkafka (Python confluent-kafka)"

    def __init__(self, args, broker):
        self.args, self.broker = args, broker

    def prepare(self, group):
        self.broker.create_topic(group)

    def start(self, bootstrap, group):
        return Holder([str(PYTHON), str(RDKAFKA), bootstrap, group, group, "idle-bench",
                       str(self.args.session_ms), str(self.args.heartbeat_ms)],
                      "stdout", stdin=subprocess.PIPE)

    def held(self, e):
        return e.get("event") == "assigned" and e.get("partitions") == [0]

    def lost(self, e):
        return e.get("event") in ("revoked", "lost", "closed")

    def stop(self, holder):
        # "close" makes the consumer leave the group, as a released lock would.
        try:
            holder.proc.stdin.write("close\n")
            holder.proc.stdin.flush()
            holder.proc.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            pass
        stop(holder.proc, signal.SIGTERM)


def start_holder(kind, proxy):
    """Starts a holder of a fresh lock with a freshly reset proxy; waits for its first byte."""
    group = "idle-" + uuid.uuid4().hex[:12]
    kind.prepare(group)
    proxy.reset()
    holder = kind.start(proxy.address, group)
    if not proxy.first.wait(BOUND):
        kind.stop(holder)
        raise SystemExit(f"{kind.name}: no request within {BOUND} s")
    return holder


def startup_sample(kind, proxy):
    """One start: returns exec -> first byte on the wire, in ms."""
    holder = start_holder(kind, proxy)
    try:
        return (proxy.first_byte_ns - holder.exec_ns) / 1e6
    finally:
        kind.stop(holder)


def idle_run(kind, proxy, seconds):
    holder = start_holder(kind, proxy)
    try:
        first_ms = (proxy.first_byte_ns - holder.exec_ns) / 1e6
        held = holder.wait_event(kind.held, f"{kind.name} holding the lock")
        pid = holder.proc.pid
        held_ns = mono_ns()
        r0 = proxy.snapshot()
        u0, s0 = cpu_ticks(pid)
        n0 = cpu_ns(pid)
        t0 = cpu_ns_by_thread(pid)
        time.sleep(seconds)
        u1, s1 = cpu_ticks(pid)
        n1 = cpu_ns(pid)
        t1 = cpu_ns_by_thread(pid)
        # Threads by name (without the tid), so the Python thread and librdkafka's show apart.
        per_thread = {}
        for key, ns in t1.items():
            name = key.rsplit("/", 1)[0]
            per_thread[name] = per_thread.get(name, 0) + (ns - t0.get(key, 0)) / 1e6
        r1 = proxy.snapshot()
        window_s = (mono_ns() - held_ns) / 1e9
        rates = {API_NAMES.get(k, str(k)): round((n - r0.get(k, 0)) / window_s, 2)
                 for k, n in sorted(r1.items()) if n > r0.get(k, 0)}
        hwm = status_kb(pid, "VmHWM")
        rss = status_kb(pid, "VmRSS")
        nthreads = threads(pid)
        holder.drain()
        lost = [e for e in holder.seen if kind.lost(e)]
        if holder.proc.poll() is not None or lost:
            raise SystemExit(f"{kind.name} stopped holding during the idle window: {lost}")
        return {
            "holder": kind.name,
            "exec_to_first_request_ms": round(first_ms, 1),
            "exec_to_holding_s": round((held.get("mono_ns", held_ns) - holder.exec_ns) / 1e9, 2),
            "startup_cpu_ms": round((u0 + s0) * 1000),
            "startup_cpu_schedstat_ms": round(n0 / 1e6, 1),
            "idle_cpu_by_thread_ms": {k: round(v, 1) for k, v in sorted(per_thread.items())},
            "idle_window_s": round(window_s, 1),
            "idle_cpu_user_ms": round((u1 - u0) * 1000),
            "idle_cpu_sys_ms": round((s1 - s0) * 1000),
            "idle_cpu_ms": round((u1 - u0 + s1 - s0) * 1000),
            "idle_cpu_schedstat_ms": round((n1 - n0) / 1e6, 1),
            "idle_cpu_percent": round(100 * (n1 - n0) / 1e9 / window_s, 3),
            "peak_rss_kb": hwm,
            "rss_kb": rss,
            "threads": nthreads,
            "idle_requests_per_s": rates,
            "idle_requests_per_s_total": round(sum(rates.values()), 2),
        }
    finally:
        kind.stop(holder)


def python_baseline():
    """The interpreter alone with confluent_kafka imported: its exec -> exit time and its RSS."""
    # Exec to "import done", timed inside the interpreter: no teardown, same clock as ours.
    samples = []
    for _ in range(5):
        t0 = mono_ns()
        out = subprocess.run(
            [str(PYTHON), "-c", "import time, confluent_kafka; "
             "print(time.clock_gettime_ns(time.CLOCK_MONOTONIC))"],
            check=True, timeout=60, capture_output=True, text=True)
        samples.append((int(out.stdout.strip()) - t0) / 1e6)
    import_ms = statistics.median(samples)
    proc = spawn([str(PYTHON), "-c", "import confluent_kafka, sys; print('ok', flush=True); "
                  "sys.stdin.read()"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        proc.stdout.readline()
        rss = status_kb(proc.pid, "VmHWM")
    finally:
        proc.stdin.close()
        stop(proc)
    return round(import_ms, 1), rss


def machine():
    model = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = status_kb_file("/proc/meminfo", "MemTotal")
    versions = subprocess.run(
        [str(PYTHON), "-c", "import importlib.metadata as m, confluent_kafka as c; "
         "print(m.version('confluent-kafka'), c.libversion()[0])"],
        capture_output=True, text=True).stdout.split()
    return {
        "cpus": os.cpu_count(),
        "cpu_model": model,
        "mem_gib": round(mem / 1048576, 1) if mem else None,
        "kernel": platform.release(),
        "loadavg_at_start": os.getloadavg(),
        "python": platform.python_version(),
        "confluent_kafka": versions[0] if versions else "?",
        "librdkafka": versions[1] if len(versions) > 1 else "?",
        "kafka": kafka_version(),
    }


def kafka_version():
    jars = sorted(LIBS.glob("kafka_2.13-*.jar"))
    jars = [j for j in jars if not j.name.endswith(("-test.jar", "-sources.jar"))]
    return "Apache Kafka " + jars[0].name[len("kafka_2.13-"):-len(".jar")] if jars else "?"


def status_kb_file(path, key):
    with open(path) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--idle-seconds", type=int, default=60)
    ap.add_argument("--session-ms", type=int, default=10000)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--startup-reps", type=int, default=10)
    ap.add_argument("--initial-delay-ms", type=int, default=0,
                    help="the broker's group.initial.rebalance.delay.ms (Kafka's default: 3000)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: --idle-seconds 10 --startup-reps 2")
    ap.add_argument("--json", help="also write the results to this file")
    args = ap.parse_args()
    if args.quick:
        args.idle_seconds, args.startup_reps = 10, 2

    if not PYTHON.exists():
        raise SystemExit(f"{PYTHON} is missing: run scripts/install-test-deps.sh")
    kinds = []
    for name, binary in BINARIES.items():
        if binary.exists():
            kinds.append(KafkaLockKind(name, binary, args))
        else:
            print(f"(skipping {name}: {binary} not built)", file=sys.stderr)
    if not kinds:
        raise SystemExit("no kafka-lock binary: cargo build --release --features cli --bin kafka-lock")
    proxy = CountingProxy()
    broker = Broker(proxy, args.initial_delay_ms)
    kinds.append(RdkafkaKind(args, broker))

    facts = machine()
    print(f"machine: {facts['cpus']} CPUs ({facts['cpu_model']}), {facts['mem_gib']} GiB, "
          f"Linux {facts['kernel']}, load {facts['loadavg_at_start']}")
    print(f"broker: {facts['kafka']} on {broker.kafka.bootstrap} (advertised through the proxy "
          f"{proxy.address}), started in {broker.kafka.startup_seconds:.1f} s, "
          f"group.initial.rebalance.delay.ms={args.initial_delay_ms}; session "
          f"{args.session_ms} ms, heartbeat {args.heartbeat_ms} ms; confluent-kafka "
          f"{facts['confluent_kafka']} / librdkafka {facts['librdkafka']}", flush=True)
    sizes = {name: b.stat().st_size for name, b in BINARIES.items() if b.exists()}

    results = []
    ok = False
    try:
        for kind in kinds:
            print(f"\n{kind.name}: idle for {args.idle_seconds} s after acquiring ...", flush=True)
            r = idle_run(kind, proxy, args.idle_seconds)
            samples = [r["exec_to_first_request_ms"]]
            for _ in range(args.startup_reps):
                samples.append(round(startup_sample(kind, proxy), 1))
            r["exec_to_first_request_samples_ms"] = samples
            r["exec_to_first_request_median_ms"] = round(statistics.median(samples), 1)
            r["exec_to_first_request_min_ms"] = min(samples)
            results.append(r)
            print(f"  exec -> first request: median {r['exec_to_first_request_median_ms']} ms, "
                  f"min {r['exec_to_first_request_min_ms']} ms (samples {samples})")
            print(f"  exec -> holding: {r['exec_to_holding_s']} s")
            print(f"  idle CPU over {r['idle_window_s']} s: {r['idle_cpu_ms']} ms "
                  f"(user {r['idle_cpu_user_ms']}, sys {r['idle_cpu_sys_ms']}; schedstat "
                  f"{r['idle_cpu_schedstat_ms']} ms = {r['idle_cpu_percent']} % of one core)")
            print(f"  idle CPU by thread (ms): {r['idle_cpu_by_thread_ms']}")
            print(f"  idle requests/s: {r['idle_requests_per_s_total']} "
                  f"{r['idle_requests_per_s']}")
            print(f"  CPU until holding: {r['startup_cpu_ms']} ms (schedstat "
                  f"{r['startup_cpu_schedstat_ms']} ms); peak RSS {r['peak_rss_kb']} kB "
                  f"(now {r['rss_kb']} kB); {r['threads']} threads", flush=True)
        import_ms, py_rss = python_baseline()
        print(f"\nbaseline: exec -> `import confluent_kafka` done: {import_ms:.1f} ms (median "
              f"of 5); an idle interpreter with it imported has peak RSS {py_rss} kB")
        for name, size in sizes.items():
            print(f"binary size: {name}: {size} bytes ({size / 1e6:.2f} MB)")
        ok = True
    finally:
        for proc in STARTED:
            stop(proc, signal.SIGKILL, timeout=5)
        if not ok:
            print(f"broker log (end):\n{broker.kafka.tail(broker.kafka.nodes[0])}", file=sys.stderr)
        broker.stop()
        proxy.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": facts, "args": vars(args), "results": results,
                       "python_baseline": {"import_ms": import_ms, "peak_rss_kb": py_rss},
                       "binary_sizes": sizes}, f, indent=2)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()

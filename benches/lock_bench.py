#!/usr/bin/env python3
"""Side-by-side lock benchmark: kafka-lock against the seed design (a librdkafka consumer whose
assignment of partition 0 is the lock), on one tansu broker, with the same timeouts.

Scenarios, each repeated --reps times on a fresh group:
  uncontended  spawn one contender; time until it holds the lock
  handover     A holds, B waits; A releases; time from A's release to B holding
  failover     A holds, B waits; SIGKILL A; time from the kill to B holding
(A acts at a random moment 1-2 s after B started waiting, the same moments for every client.)

Every time comes from CLOCK_MONOTONIC readings taken by the processes themselves (the contenders
print JSON events with mono_ns) or by this script just before it acts, so they compare across
processes. Usage (after scripts/install-test-deps.sh and
`cargo build --release --example contender`):

    python3 benches/lock_bench.py [--reps 3] [--session-ms 6000] [--heartbeat-ms 1000]
"""

import argparse
import json
import queue
import random
import signal
import statistics
import subprocess
import sys
import threading
import tempfile
import time
import uuid
from pathlib import Path

from idle_bench import PYTHON, TANSU, Broker, mono_ns

ROOT = Path(__file__).resolve().parent.parent
CONTENDER = ROOT / "target/release/examples/contender"
RDKAFKA = ROOT / "tests/interop/rdkafka_lock.py"
BOUND = 90.0


def new_broker():
    # The idle benchmark's broker launcher: loopback port, memory storage, stopped with us.
    return Broker(tempfile.mkdtemp(prefix="kafka-lock-bench-"))


class Contender:
    """A contender process printing JSON events on stdout; 'close' on stdin releases."""

    def __init__(self, argv):
        self.spawned_ns = mono_ns()
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True)
        self.events = queue.Queue()
        self.log = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.events.put(json.loads(line))
            except ValueError:
                pass

    def wait(self, what, pred):
        deadline = time.monotonic() + BOUND
        while True:
            try:
                e = self.events.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise SystemExit(f"timed out waiting for {what}; saw {self.log}")
            self.log.append(e)
            if pred(e):
                return e

    def close(self):
        self.proc.stdin.write("close\n")
        self.proc.stdin.flush()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class KafkaLock:
    name = "kafka-lock (native)"

    def __init__(self, broker, session_ms, heartbeat_ms):
        self.broker, self.session_ms, self.heartbeat_ms = broker, session_ms, heartbeat_ms

    def new_lock(self):
        return "bench-" + uuid.uuid4().hex[:12]

    def spawn(self, lock, _client_id):
        return Contender([str(CONTENDER), self.broker.bootstrap, lock, "--session-ms", str(self.session_ms),
                          "--heartbeat-ms", str(self.heartbeat_ms)])

    @staticmethod
    def is_held(e):
        return e["event"] == "acquired"

    @staticmethod
    def is_waiting(e):
        return e["event"] == "waiting"

    @staticmethod
    def is_released(e):
        return e["event"] == "released"

    def steady_after_waiter_joined(self, holder):
        pass  # sticky: the holder keeps the lock through the waiter's join, nothing to wait for


class Rdkafka:
    name = "librdkafka consumer (seed design)"

    def __init__(self, broker, session_ms, heartbeat_ms):
        self.broker, self.session_ms, self.heartbeat_ms = broker, session_ms, heartbeat_ms

    def new_lock(self):
        topic = "bench-" + uuid.uuid4().hex[:12]
        self.broker.create_topic(topic)
        return topic

    def spawn(self, lock, client_id):
        return Contender([str(PYTHON), str(RDKAFKA), self.broker.bootstrap, lock, lock, client_id,
                          str(self.session_ms), str(self.heartbeat_ms)])

    @staticmethod
    def is_held(e):
        return e["event"] == "assigned" and e.get("partitions") == [0]

    @staticmethod
    def is_waiting(e):
        return e["event"] == "assigned" and e.get("partitions") == []

    @staticmethod
    def is_released(e):
        return e["event"] in ("revoked", "lost") and 0 in e.get("partitions", [])

    def steady_after_waiter_joined(self, holder):
        # Eager range: the holder gives partition 0 up for the waiter's join and, sorting first,
        # gets it back.
        holder.wait("reassignment", self.is_held)


def uncontended(client, _rep):
    lock = client.new_lock()
    a = client.spawn(lock, "a")
    try:
        held = a.wait("hold", client.is_held)
        return (held["mono_ns"] - a.spawned_ns) / 1e9
    finally:
        a.close()
        a.wait("close", lambda e: e["event"] == "closed")
        a.kill()


def two_contenders(client, rep):
    lock = client.new_lock()
    a = client.spawn(lock, "a")
    a.wait("hold", client.is_held)
    b = client.spawn(lock, "b")
    b.wait("waiting", client.is_waiting)
    client.steady_after_waiter_joined(a)
    # Act at a random phase of the waiter's heartbeat cycle (the same delays for every client):
    # acting right after the waiter synced would always catch it a full interval before its next
    # heartbeat, which measures the schedule, not the client.
    time.sleep(random.Random(rep).uniform(1.0, 2.0))
    return a, b


def handover(client, rep):
    a, b = two_contenders(client, rep)
    try:
        a.close()
        released = a.wait("release", client.is_released)
        held = b.wait("hold", client.is_held)
        return (held["mono_ns"] - released["mono_ns"]) / 1e9
    finally:
        a.kill()
        b.close()
        b.kill()


def failover(client, rep):
    a, b = two_contenders(client, rep)
    try:
        killed = mono_ns()
        a.proc.send_signal(signal.SIGKILL)
        held = b.wait("hold", client.is_held)
        return (held["mono_ns"] - killed) / 1e9
    finally:
        a.kill()
        b.close()
        b.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    args = ap.parse_args()
    for p, how in [(TANSU, "scripts/install-test-deps.sh"), (PYTHON, "scripts/install-test-deps.sh"),
                   (CONTENDER, "cargo build --release --example contender")]:
        if not p.exists():
            raise SystemExit(f"{p} is missing: run {how}")
    broker = new_broker()
    try:
        clients = [KafkaLock(broker, args.session_ms, args.heartbeat_ms),
                   Rdkafka(broker, args.session_ms, args.heartbeat_ms)]
        rows = []
        for scenario in (uncontended, handover, failover):
            for client in clients:
                times = [scenario(client, rep) for rep in range(args.reps)]
                rows.append((scenario.__name__, client.name, times))
                print(f"{scenario.__name__:12} {client.name:36} " + " ".join(f"{t:.3f}" for t in times),
                      file=sys.stderr, flush=True)
        print(f"\nsession {args.session_ms} ms, heartbeat {args.heartbeat_ms} ms, {args.reps} runs each, "
              f"tansu on loopback\n")
        print("| scenario | client | median (s) | min (s) | max (s) | runs (s) |")
        print("|---|---|---|---|---|---|")
        for scenario, name, times in rows:
            print(f"| {scenario} | {name} | {statistics.median(times):.3f} | {min(times):.3f} | "
                  f"{max(times):.3f} | {', '.join(f'{t:.3f}' for t in times)} |")
    finally:
        broker.stop()


if __name__ == "__main__":
    main()

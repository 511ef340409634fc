#!/usr/bin/env python3
"""Many locks in one process, through one Client: sockets, peak RSS, idle CPU and the time to
acquire all, on a throw-away Apache Kafka (scripts/local_kafka.py).

For each initial rebalance delay and each N it runs

    target/release/examples/many_locks BOOTSTRAP N HOLD_SECS PREFIX

(build it first: `cargo build --release --no-default-features --example many_locks`), waits for
its `acquired A of N in S s` line, lets it settle for SETTLE seconds, then counts its sockets
(/proc/PID/fd entries that are sockets; once right after the acquisitions, with the lanes they
opened still idle, and again while idle, once those are closed) and measures its CPU over IDLE seconds; peak RSS is
VmHWM and RSS while holding VmRSS, both read just before it prints `held at end H of N`.

    python3 benches/many_locks_bench.py [--delays 3000,0] [--ns 1,100,1000,10000] [--nodes 1]
"""

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
from local_kafka import LocalKafka  # noqa: E402

TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
EXAMPLE = TARGET / "release/examples/many_locks"
CLK_TCK = os.sysconf("SC_CLK_TCK")
# Past pool::IDLE_AFTER (60 s) plus a reaper period (15 s): the lanes the acquisitions opened
# are closed by then, and what is left is what holding costs.
SETTLE = 80.0
IDLE = 30.0


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def status_kb(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return None


def sockets(pid):
    """TCP sockets of the process (the runtime's Unix-domain socketpair is not a connection)."""
    tcp = set()
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f)
                tcp.update(line.split()[9] for line in f)
        except OSError:
            pass
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            link = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if link.startswith("socket:[") and link[8:-1] in tcp:
            n += 1
    return n


def run(bootstrap, n, acquire_bound):
    hold = int(SETTLE + IDLE + 5)
    prefix = f"many-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen([str(EXAMPLE), bootstrap, str(n), str(hold), prefix],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    row = {"n": n}
    try:
        peak_sockets = 0
        line = proc.stdout.readline()
        if not line.startswith("acquired"):
            row["error"] = f"no acquired line (got {line!r})"
            return row
        row["acquired"] = line.split()[1]
        row["acquire_s"] = float(line.split()[-2])
        row["sockets_after_acquire"] = sockets(proc.pid)
        time.sleep(SETTLE)
        t0, c0 = time.monotonic(), cpu_s(proc.pid)
        while time.monotonic() - t0 < IDLE:
            peak_sockets = max(peak_sockets, sockets(proc.pid))
            time.sleep(1.0)
        c1, t1 = cpu_s(proc.pid), time.monotonic()
        row["sockets"] = peak_sockets
        row["idle_cpu_pct"] = round(100.0 * (c1 - c0) / (t1 - t0), 3)
        row["rss_kb"] = status_kb(proc.pid, "VmHWM")
        # What holding costs, without the burst of acquisitions that set the peak.
        row["rss_held_kb"] = status_kb(proc.pid, "VmRSS")
        line = proc.stdout.readline()
        row["held_at_end"] = line.split()[3] if line.startswith("held") else line.strip()
        proc.wait(timeout=acquire_bound)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
    return row


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--delays", default="3000,0")
    ap.add_argument("--ns", default="1,100,1000,10000")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--json")
    args = ap.parse_args()
    if not EXAMPLE.exists():
        sys.exit(f"{EXAMPLE} missing: cargo build --release --no-default-features --example many_locks")
    rows = []
    for delay in [int(d) for d in args.delays.split(",")]:
        with LocalKafka(nodes=args.nodes, initial_delay_ms=delay) as kafka:
            for n in [int(x) for x in args.ns.split(",")]:
                row = run(kafka.bootstrap, n, acquire_bound=900)
                row["delay_ms"] = delay
                row["nodes"] = args.nodes
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

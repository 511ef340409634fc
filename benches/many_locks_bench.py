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

With --request-rates the brokers log every request they complete (kafka.request.logger at
DEBUG, scripts/local_kafka.py) and the rows get, per API, the requests of the example's client
(client id `kafka-lock`) that all brokers completed: in total while it acquired (from its start
to its `acquired` line, `acquire_requests`) and per second over the IDLE seconds of holding
(`idle_requests_per_s`; `idle_requests_per_s_by_node` per node). The logging costs the brokers
CPU, not the client: run it apart from the figures above if the brokers' CPU matters.

    python3 benches/many_locks_bench.py [--delays 3000,0] [--ns 1,100,1000,10000] [--nodes 1|3]
                                        [--request-rates]
"""

import argparse
import json
import os
import re
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


REQUEST = re.compile(r'"clientId":"([^"]*)","requestApiKeyName":"([A-Z_]+)"')


class RequestLogs:
    """Counts, per API, the requests of one client id in the brokers' request logs between two
    marks (byte offsets into each node's log)."""

    def __init__(self, kafka, client_id="kafka-lock"):
        self.nodes = kafka.nodes if kafka is not None else []
        self.client_id = client_id

    def mark(self):
        return {n.node_id: n.requests.stat().st_size if n.requests.exists() else 0 for n in self.nodes}

    def count(self, since, until):
        by_node = {}
        for n in self.nodes:
            counts = {}
            with open(n.requests, "rb") as f:
                f.seek(since[n.node_id])
                data = f.read(until[n.node_id] - since[n.node_id]).decode(errors="replace")
            for client, api in REQUEST.findall(data):
                if client == self.client_id:
                    counts[api] = counts.get(api, 0) + 1
            by_node[n.node_id] = counts
        total = {}
        for counts in by_node.values():
            for api, c in counts.items():
                total[api] = total.get(api, 0) + c
        return total, by_node


def run(bootstrap, n, acquire_bound, logs=None):
    hold = int(SETTLE + IDLE + 5)
    prefix = f"many-{uuid.uuid4().hex[:8]}"
    started = logs.mark() if logs else None
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
        if logs:
            row["acquire_requests"] = logs.count(started, logs.mark())[0]
        time.sleep(SETTLE)
        m0 = logs.mark() if logs else None
        t0, c0 = time.monotonic(), cpu_s(proc.pid)
        while time.monotonic() - t0 < IDLE:
            peak_sockets = max(peak_sockets, sockets(proc.pid))
            time.sleep(1.0)
        c1, t1 = cpu_s(proc.pid), time.monotonic()
        if logs:
            total, by_node = logs.count(m0, logs.mark())
            rate = lambda counts: {api: round(c / (t1 - t0), 2) for api, c in sorted(counts.items())}
            row["idle_requests_per_s"] = rate(total)
            row["idle_requests_per_s_by_node"] = {node: rate(c) for node, c in by_node.items()}
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
    ap.add_argument("--request-rates", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not EXAMPLE.exists():
        sys.exit(f"{EXAMPLE} missing: cargo build --release --no-default-features --example many_locks")
    rows = []
    for delay in [int(d) for d in args.delays.split(",")]:
        with LocalKafka(nodes=args.nodes, initial_delay_ms=delay, request_log=args.request_rates) as kafka:
            logs = RequestLogs(kafka) if args.request_rates else None
            for n in [int(x) for x in args.ns.split(",")]:
                row = run(kafka.bootstrap, n, acquire_bound=900, logs=logs)
                row["delay_ms"] = delay
                row["nodes"] = args.nodes
                print(json.dumps(row), flush=True)
                rows.append(row)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()

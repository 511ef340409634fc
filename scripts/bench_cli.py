#!/usr/bin/env python3
"""The same shell command wrapped by `etcdctl lock` and by `kafka-lock run` (without and with a
ledger topic), side by side on one machine, loopback only. scripts/bench-cli.sh builds the
release binary, installs etcd when missing and runs this.

  acquire   spawn of the wrapper -> the command's first line (uncontended, a fresh lock)
  handover  A's command holds; B waits; 1-2 s later (random, the same moments for every tool)
            A's command is told to finish: its last line -> B's command's first line
  failover  as handover, but A's whole process group is SIGKILLed: the kill -> B's first line

Every time is a CLOCK_REALTIME reading (the driver's time.time_ns() just before it acts, the
commands' bash $EPOCHREALTIME, no fork), so all of them are comparable on this host. Apache
Kafka 4.1.2 (scripts/local_kafka.py, one node, group.initial.rebalance.delay.ms=0); etcd one
member on loopback; session/TTL 6 s, heartbeat 1 s. Every process started is stopped on exit,
on an exception and on SIGINT/SIGTERM.
"""

import argparse
import json
import os
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "benches"))
from local_kafka import LocalKafka, free_ports, linger_config  # noqa: E402

SESSION_S = 6
LIVE = []  # every Popen started, stopped in cleanup()


def spawn(argv, env=None, log=None):
    # A session of its own: the failover kills exactly this group, and cleanup reaches it.
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log or subprocess.DEVNULL,
                         stderr=log or subprocess.DEVNULL, start_new_session=True,
                         env={**os.environ, **(env or {})})
    LIVE.append(p)
    return p


def stop(p, grace=3.0):
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(grace)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
    if p in LIVE:
        LIVE.remove(p)


def cleanup():
    for p in list(LIVE):
        stop(p, grace=1.0)


class Etcd:
    def __init__(self):
        self.dir = Path(tempfile.mkdtemp(prefix="kafka-lock-etcd-"))
        client, peer = free_ports(2)
        self.url = f"http://127.0.0.1:{client}"
        self.proc = spawn(["etcd", "--name", "bench", "--data-dir", str(self.dir / "data"),
                           "--listen-client-urls", self.url, "--advertise-client-urls", self.url,
                           "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                           "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                           "--initial-cluster", f"bench=http://127.0.0.1:{peer}"],
                          log=open(self.dir / "etcd.log", "w"))
        deadline = time.monotonic() + 30
        while subprocess.run(self.ctl("endpoint", "health"), capture_output=True,
                             env={**os.environ, "ETCDCTL_API": "3"}).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"etcd did not start; its log: {self.dir / 'etcd.log'}")
            time.sleep(0.1)

    def ctl(self, *args):
        return ["etcdctl", "--endpoints", self.url, *args]

    def close(self):
        stop(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


class Tool:
    def __init__(self, name, wrap, env=None):
        self.name, self.wrap, self.env = name, wrap, env or {}

    def start(self, lock, script, log):
        return spawn(self.wrap(lock, ["bash", "-c", script]), env=self.env, log=log)


def kafka_lock_tool(binary, bootstrap, ledger=None, env=None, tag=""):
    def wrap(lock, cmd):
        argv = [binary, "run", "--bootstrap", bootstrap, "--lock", lock,
                "--session-timeout", f"{SESSION_S}s", "--heartbeat-interval", "1s"]
        if ledger:
            argv += ["--ledger-topic", ledger]
        return argv + ["--", *cmd]
    name = ("kafka-lock run --ledger-topic" if ledger else "kafka-lock run") + tag
    return Tool(name, wrap, env)


def etcd_tool(etcd):
    return Tool(f"etcdctl lock --ttl {SESSION_S}",
                lambda lock, cmd: etcd.ctl("lock", "--ttl", str(SESSION_S), lock, "--", *cmd),
                {"ETCDCTL_API": "3"})


def stamps(path):
    """{'start': ns, 'held': ns, 'end': ns} from the lines a command wrote."""
    out = {}
    try:
        for line in Path(path).read_text().splitlines():
            k, v = line.split()
            out[k] = int(v.replace(".", "")) * 1000  # EPOCHREALTIME has microseconds
    except (OSError, ValueError):
        pass
    return out


def wait_for(path, key, proc, bound):
    deadline = time.monotonic() + bound
    while key not in stamps(path):
        if time.monotonic() > deadline:
            raise RuntimeError(f"no {key!r} in {path} within {bound} s")
        if proc.poll() is not None and key not in stamps(path):
            raise RuntimeError(f"{proc.args[0]} exited {proc.returncode} before {key!r}")
        time.sleep(0.002)
    return stamps(path)[key]


def acquire_once(tool, work, i):
    """(spawn, first line) in realtime ns of one uncontended acquire of a fresh lock."""
    f = work / f"acq-{i}"
    log = open(work / f"acq-{i}.log", "w")
    t0 = time.time_ns()
    p = tool.start(f"bench-acq-{uuid.uuid4().hex[:8]}", f"echo start $EPOCHREALTIME >> {f}", log)
    t1 = wait_for(f, "start", p, 30)
    p.wait(30)
    LIVE.remove(p)
    return t0, t1


def acquire(tool, work, i, delay):
    t0, t1 = acquire_once(tool, work, i)
    return (t1 - t0) / 1e6


def contended(tool, work, i, delay, kill):
    lock = f"bench-{'fail' if kill else 'hand'}-{uuid.uuid4().hex[:8]}"
    fa, fb, fifo = work / f"a-{i}", work / f"b-{i}", work / f"fifo-{i}"
    os.mkfifo(fifo)
    a = tool.start(lock, f"echo held $EPOCHREALTIME >> {fa}; read -r _ < {fifo}; "
                         f"echo end $EPOCHREALTIME >> {fa}", open(work / f"a-{i}.log", "w"))
    wait_for(fa, "held", a, 30)
    b = tool.start(lock, f"echo start $EPOCHREALTIME >> {fb}", open(work / f"b-{i}.log", "w"))
    time.sleep(delay)
    if b.poll() is not None:
        raise RuntimeError(f"the waiter exited {b.returncode} before the holder let go")
    if kill:
        t0 = time.time_ns()
        os.killpg(a.pid, signal.SIGKILL)
    else:
        with open(fifo, "w") as w:
            w.write("go\n")
    t1 = wait_for(fb, "start", b, SESSION_S * 3)
    if not kill:
        t0 = wait_for(fa, "end", a, 5)
    for p in (a, b):
        stop(p, grace=SESSION_S * 2)
    # After a kill the holder's command is stopped by its supervisor (kafka-lock) or died with
    # the group (etcdctl): nothing of A is left to stop here.
    return (t1 - t0) / 1e6


def log_stamps(path, who):
    """(realtime ns, who, what) of every request and answer in a KAFKA_LOCK_LOG=trace log."""
    import datetime
    import re
    out = []
    sent = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        m = re.match(r"(\S+Z)\s+\w+\s+(.*)", line)
        if not m:
            continue
        ts, tail = m.groups()
        # The target follows the spans (`kafka_lock{group=..}: `), if any.
        m = re.search(r"(kafka_lock(?:::\w+)*): (.*)", tail)
        if not m:
            continue
        target, rest = m.groups()
        frac = ts[19:-1].lstrip(".")
        t = datetime.datetime.strptime(ts[:19], "%Y-%m-%dT%H:%M:%S").replace(tzinfo=datetime.timezone.utc)
        ns = int(t.timestamp()) * 10**9 + int((frac + "000000000")[:9])
        api = re.search(r"api=(\w+)", rest)
        corr = re.search(r"correlation_id=(\d+)", rest)
        peer = re.search(r"peer=(\S+)", rest)
        word = rest.split()[0] if rest else ""
        if api and word in ("request", "response"):
            key = (api.group(1), corr.group(1) if corr else "?", peer.group(1) if peer else "")
            step = f"{word} {key[0]} #{key[1]} {key[2]}"
            if word == "request":
                sent[key] = ns
            elif key in sent:
                step += f" (answered in {(ns - sent.pop(key)) / 1e6:.2f})"
            out.append((ns, who, step))
        elif "driver" not in target:
            out.append((ns, who, rest[:90]))
    return out


def timeline(work, i):
    """One handover as a table, times relative to the holder's command's last line."""
    rows = []
    a, b = stamps(work / f"a-{i}"), stamps(work / f"b-{i}")
    rows += [(a["end"], "A command", "last line (end)"), (b["start"], "B command", "first line")]
    roles = {}
    for line in (work / "trace").read_text().splitlines():
        mono, real, pid, parent, role, step = line.split()
        roles.setdefault(pid, (role, parent))
        rows.append((int(real), pid, step))
    rows += log_stamps(work / f"a-{i}.log", "A run")
    rows += log_stamps(work / f"b-{i}.log", "B run")
    # Name processes: A's and B's kafka-lock by which log holds their pid's first stamp time.
    names = {}
    ks = [pid for pid, (role, _) in roles.items() if role == "run"]
    for pid in ks:
        first = min(r[0] for r in rows if r[1] == pid)
        names[pid] = "A run" if first < a["held"] else "B run"
    for pid, (role, parent) in roles.items():
        if role == "supervisor":
            names[pid] = names.get(parent, "?")[0] + " supervisor"
    t0 = a["end"]
    rows = [(t, names.get(w, w), s) for t, w, s in rows if t >= t0 - 5_000_000]
    rows.sort()
    out = ["| ms after A's command ended | process | step |", "|---|---|---|"]
    for t, w, s in rows:
        out.append(f"| {(t - t0) / 1e6:8.2f} | {w} | {s} |")
    return "\n".join(out)


def acquire_timeline(work, i, t0):
    """One uncontended acquire as a table, times relative to the spawn of kafka-lock."""
    rows = [(t0, "bench", "spawn of kafka-lock run"),
            (stamps(work / f"acq-{i}")["start"], "command", "first line")]
    names = {}
    for line in (work / "trace").read_text().splitlines():
        mono, real, pid, parent, role, step = line.split()
        names.setdefault(pid, role)
        rows.append((int(real), pid, step))
    rows += log_stamps(work / f"acq-{i}.log", "run")
    rows = sorted((t, names.get(w, w), s) for t, w, s in rows)
    out = ["| ms after the spawn | process | step |", "|---|---|---|"]
    for t, w, s in rows:
        out.append(f"| {(t - t0) / 1e6:8.2f} | {w} | {s} |")
    return "\n".join(out)


SCENARIOS = {
    "acquire": acquire,
    "handover": lambda t, w, i, d: contended(t, w, i, d, kill=False),
    "failover": lambda t, w, i, d: contended(t, w, i, d, kill=True),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10, help="rounds per tool and scenario (default 10)")
    ap.add_argument("--only", default="acquire,handover,failover", help="comma-separated scenarios")
    ap.add_argument("--binary", default=str(ROOT / "target/release/kafka-lock"))
    ap.add_argument("--no-etcd", action="store_true", help="leave etcd out")
    ap.add_argument("--compare", metavar="BINARY",
                    help="another kafka-lock binary (an earlier build) measured in the same rounds")
    ap.add_argument("--json", help="write every measurement here")
    ap.add_argument("--seed", type=int, default=26)
    ap.add_argument("--append-linger-ms", type=int, default=None,
                    help="the broker's group.coordinator.append.linger.ms (Apache 4.x's default: 5; "
                         "every group-coordinator write, the SyncGroup's generation and each "
                         "OffsetCommit, waits up to this long to batch): 0 shows how much of the "
                         "handover it is")
    ap.add_argument("--trace", nargs="?", const="handover", choices=("handover", "acquire"),
                    help="one handover (the default) or one uncontended acquire of each kafka-lock "
                         "variant, taken apart: the step stamps of the kafka-lock processes and their "
                         "supervisors (KAFKA_LOCK_TRACE_FILE), their requests and answers "
                         "(KAFKA_LOCK_LOG=trace) and the commands' readings")
    ap.add_argument("--keep", action="store_true",
                    help="leave the working directory (the commands' readings, the logs, the trace "
                         "file) in place and print its path")
    args = ap.parse_args()
    only = [s for s in args.only.split(",") if s]
    if args.trace:
        args.no_etcd = True
    for s in only:
        if s not in SCENARIOS:
            raise SystemExit(f"unknown scenario {s!r}; known: {', '.join(SCENARIOS)}")
    if not os.access(args.binary, os.X_OK):
        raise SystemExit(f"no kafka-lock binary at {args.binary}: cargo build --release --features cli --bin kafka-lock")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = Path(tempfile.mkdtemp(prefix="kafka-lock-bench-cli-"))
    etcd = None
    results = {}
    try:
        with LocalKafka(initial_delay_ms=0, extra=linger_config(args.append_linger_ms)) as kafka:
            from lock_bench import create_topic
            ledger = f"bench-ledger-{uuid.uuid4().hex[:8]}"
            create_topic(kafka.bootstrap, ledger)
            tools = []
            if not args.no_etcd:
                if shutil.which("etcd") and shutil.which("etcdctl"):
                    etcd = Etcd()
                    tools.append(etcd_tool(etcd))
                else:
                    print("etcd or etcdctl not found (apt-get install etcd-server etcd-client): "
                          "etcd is left out", file=sys.stderr)
            trace = {}
            if args.trace:
                trace = {"KAFKA_LOCK_TRACE_FILE": str(work / "trace"),
                         "KAFKA_LOCK_LOG": "kafka_lock=trace"}
            tools.append(kafka_lock_tool(args.binary, kafka.bootstrap, env=trace))
            tools.append(kafka_lock_tool(args.binary, kafka.bootstrap, ledger, env=trace))
            if args.compare and not args.trace:
                tag = f" ({Path(args.compare).name})"
                tools.append(kafka_lock_tool(args.compare, kafka.bootstrap, tag=tag))
                tools.append(kafka_lock_tool(args.compare, kafka.bootstrap, ledger, tag=tag))
            load = os.getloadavg()
            if args.trace == "acquire":
                print(f"load average {load[0]:.2f}")
                for k, tool in enumerate(tools):
                    acquire_once(tool, work, f"trace-warm-{k}")
                    (work / "trace").unlink(missing_ok=True)
                    t0, t1 = acquire_once(tool, work, f"trace-{k}")
                    print(f"\n{tool.name}: acquire {(t1 - t0) / 1e6:.1f} ms\n")
                    print(acquire_timeline(work, f"trace-{k}", t0))
                print(f"\nload average {os.getloadavg()[0]:.2f}")
                return
            if args.trace:
                for k, tool in enumerate(tools):
                    contended(tool, work, f"trace-warm-{k}", 1.0, kill=False)
                    (work / "trace").unlink(missing_ok=True)
                    ms = contended(tool, work, f"trace-{k}", 1.5, kill=False)
                    print(f"\n{tool.name}: handover {ms:.1f} ms\n")
                    print(timeline(work, f"trace-{k}"))
                return
            for scen in only:
                rng = random.Random(args.seed)
                delays = [1 + rng.random() for _ in range(args.rounds + 1)]
                for tool in tools:
                    # One untimed round first: page cache, the broker's JIT, etcd's first lease.
                    SCENARIOS[scen](tool, work, f"{scen}-warm-{tools.index(tool)}", delays[0])
                for r in range(args.rounds):
                    for k, tool in enumerate(tools):
                        ms = SCENARIOS[scen](tool, work, f"{scen}-{k}-{r}", delays[r + 1])
                        results.setdefault(scen, {}).setdefault(tool.name, []).append(ms)
                        print(f"{scen:9} {tool.name:32} round {r + 1}: {ms:9.1f} ms", file=sys.stderr)
            load = (load, os.getloadavg())
    finally:
        cleanup()
        if etcd:
            etcd.close()
        if args.keep:
            print(f"kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)

    linger = ("the broker's default" if args.append_linger_ms is None
              else f"{args.append_linger_ms} ms")
    print(f"\nload average at start {load[0][0]:.2f}, at end {load[1][0]:.2f}; "
          f"{args.rounds} rounds; group.coordinator.append.linger.ms {linger}; "
          f"medians (min-max) in ms\n")
    names = list(dict.fromkeys(n for s in results.values() for n in s))
    print("| | " + " | ".join(only) + " |")
    print("|---|" + "---|" * len(only))
    for n in names:
        cells = []
        for s in only:
            v = results.get(s, {}).get(n)
            cells.append(f"{statistics.median(v):.1f} ({min(v):.1f}-{max(v):.1f})" if v else "")
        print(f"| `{n}` | " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps({"load": load, "rounds": args.rounds, "results": results}, indent=1))


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        cleanup()
        sys.exit(130)

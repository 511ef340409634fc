#!/usr/bin/env python3
"""A throw-away Apache Kafka broker (KRaft, one JVM per node) on loopback, for the demo and the
benchmarks. The integration tests have their own launcher in Rust (tests/it/support/kafka); this
one serves the scripts, which are Python and bash.

It runs the pinned broker jars that scripts/install-test-deps.sh puts into .tools/kafka/libs, as
a plain JVM: no Docker, no tarball. Data lives in a temporary directory that is removed on stop.

As a module:

    with LocalKafka(initial_delay_ms=0) as kafka:      # one combined broker+controller node
        print(kafka.bootstrap)                           # 127.0.0.1:PORT

    with LocalKafka(nodes=3) as cluster:                 # three nodes, one controller quorum
        cluster.kill(cluster.coordinator_of("my-lock"))  # SIGKILL the group's coordinator

From a shell (the demo): `python3 scripts/local_kafka.py [--initial-delay-ms N] [--nodes N]`
prints `bootstrap=HOST:PORT[,...]` once the broker answers FindCoordinator, then keeps it running
until its stdin closes or it gets SIGINT/SIGTERM. Either way every JVM it started is killed.
Nothing listens on anything but 127.0.0.1.
"""

import argparse
import base64
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LIBS = Path(os.environ.get("KAFKA_LOCK_KAFKA_LIBS", ROOT / ".tools/kafka/libs"))
JAVA = os.environ.get("KAFKA_LOCK_JAVA", "java")
INSTALL_HINT = "run scripts/install-test-deps.sh (it fetches the pinned Apache Kafka jars into .tools/kafka/libs)"

# A small machine: one coordinator thread, few network/io threads, a cleaner buffer of a few MiB
# instead of the 128 MiB it allocates by default at start.
COMMON = {
    "num.network.threads": "2",
    "num.io.threads": "2",
    "group.coordinator.threads": "1",
    "log.cleaner.threads": "1",
    "log.cleaner.dedupe.buffer.size": str(2 * 1024 * 1024),
    "auto.create.topics.enable": "false",
    "auto.leader.rebalance.enable": "false",
    "broker.session.timeout.ms": "3000",
    "broker.heartbeat.interval.ms": "500",
}

LOG4J2 = """status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
logger.started.name = kafka.server.KafkaRaftServer
logger.started.level = info
"""

# kafka.request.logger at DEBUG: one line per request the broker completed, with its header
# (API key, client id) but not its body (that is TRACE), in a file of its own.
LOG4J2_REQUESTS = """appender.requests.type = File
appender.requests.name = requests
appender.requests.fileName = {requests}
appender.requests.layout.type = PatternLayout
appender.requests.layout.pattern = %m%n
logger.request.name = kafka.request.logger
logger.request.level = debug
logger.request.additivity = false
logger.request.appenderRef.requests.ref = requests
"""


def free_ports(n):
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def linger_config(ms):
    """The broker setting for `--append-linger-ms`; `{}` (the broker's default) for `None`."""
    return {} if ms is None else {"group.coordinator.append.linger.ms": str(ms)}


def find_coordinator(bootstrap, group, timeout=2.0):
    """FindCoordinator v0 over a raw socket: (error_code, node_id, host, port)."""
    host, port = bootstrap.rsplit(":", 1)
    key = group.encode()
    client = b"kafka-lock-scripts"
    body = struct.pack(">hhih", 10, 0, 1, len(client)) + client + struct.pack(">h", len(key)) + key
    with socket.create_connection((host, int(port)), timeout=timeout) as s:
        s.sendall(struct.pack(">i", len(body)) + body)
        size = struct.unpack(">i", _read_exact(s, 4))[0]
        data = _read_exact(s, size)
    _corr, err, node = struct.unpack(">ihi", data[:10])
    hlen = struct.unpack(">h", data[10:12])[0]
    chost = data[12:12 + hlen].decode()
    cport = struct.unpack(">i", data[12 + hlen:16 + hlen])[0]
    return err, node, chost, cport


def _read_exact(s, n):
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    return buf


class Node:
    def __init__(self, node_id, port, controller_port, data, log):
        self.node_id = node_id
        self.port = port
        self.controller_port = controller_port
        self.data = data
        self.log = log
        self.config = data / "server.properties"
        self.requests = data / "requests.log"
        self.proc = None

    @property
    def address(self):
        return f"127.0.0.1:{self.port}"


class LocalKafka:
    """One or three Apache Kafka nodes on loopback; a context manager that always kills them."""

    def __init__(self, nodes=1, initial_delay_ms=0, extra=None, ready_timeout=120.0, request_log=False):
        """`request_log`: every node logs each request it completes to `node.requests`."""
        if not LIBS.is_dir() or not any(LIBS.glob("kafka_2.13-*.jar")):
            raise SystemExit(f"no Apache Kafka jars in {LIBS}: {INSTALL_HINT}")
        self.dir = Path(tempfile.mkdtemp(prefix="kafka-lock-kafka-"))
        self.ready_timeout = ready_timeout
        ports = free_ports(2 * nodes)
        self.nodes = [
            Node(i + 1, ports[2 * i], ports[2 * i + 1], self.dir / f"node{i + 1}", self.dir / f"node{i + 1}.log")
            for i in range(nodes)
        ]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.controller_port}" for n in self.nodes)
        rf = str(min(nodes, 3))
        cluster_id = base64.urlsafe_b64encode(os.urandom(16)).rstrip(b"=").decode()
        if cluster_id.startswith("-"):
            cluster_id = "A" + cluster_id[1:]
        self.cluster_id = cluster_id
        for n in self.nodes:
            n.data.mkdir(parents=True)
            props = {
                "process.roles": "broker,controller",
                "node.id": str(n.node_id),
                "controller.quorum.voters": voters,
                "listeners": f"PLAINTEXT://127.0.0.1:{n.port},CONTROLLER://127.0.0.1:{n.controller_port}",
                "advertised.listeners": f"PLAINTEXT://127.0.0.1:{n.port}",
                "controller.listener.names": "CONTROLLER",
                "inter.broker.listener.name": "PLAINTEXT",
                "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
                "log.dirs": str(n.data / "logs"),
                "offsets.topic.num.partitions": "1" if nodes == 1 else "3",
                "offsets.topic.replication.factor": rf,
                "transaction.state.log.replication.factor": rf,
                "transaction.state.log.min.isr": "1",
                "group.initial.rebalance.delay.ms": str(initial_delay_ms),
                **COMMON,
                **(extra or {}),
            }
            n.config.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
            log4j = LOG4J2.format(log=n.log)
            if request_log:
                log4j += LOG4J2_REQUESTS.format(requests=n.requests)
            (n.data / "log4j2.properties").write_text(log4j)
        self.bootstrap = ",".join(n.address for n in self.nodes)

    def _java(self, node, main, args, heap):
        return [
            JAVA, f"-Xms{heap[0]}", f"-Xmx{heap[1]}", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
            f"-Dlog4j2.configurationFile={node.data / 'log4j2.properties'}",
            "-cp", str(LIBS / "*"), main, *args,
        ]

    def _format(self, node):
        cmd = self._java(node, "kafka.tools.StorageTool",
                         ["format", "--cluster-id", self.cluster_id, "--config", str(node.config),
                          "--ignore-formatted"], ("16m", "256m"))
        out = subprocess.run(cmd, capture_output=True, text=True)
        if out.returncode != 0:
            raise SystemExit(f"formatting node {node.node_id} failed:\n{out.stdout}{out.stderr}")

    def start_node(self, node):
        cmd = self._java(node, "kafka.Kafka", [str(node.config)], ("128m", "512m"))
        # Its own process group, so a signal meant for the caller's group never reaches it, and a
        # pause or kill of the node never touches the caller.
        node.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, process_group=0)

    def start(self):
        started = time.monotonic()
        try:
            for n in self.nodes:
                self._format(n)
            for n in self.nodes:
                self.start_node(n)
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def wait_ready(self, group="kafka-lock-ready"):
        """Until every live node's listener accepts and FindCoordinator answers NONE."""
        deadline = time.monotonic() + self.ready_timeout
        for n in self.nodes:
            while True:
                if n.proc is not None and n.proc.poll() is not None:
                    raise SystemExit(f"Kafka node {n.node_id} exited with {n.proc.returncode}; its log:\n{self.tail(n)}")
                try:
                    if find_coordinator(n.address, group)[0] == 0:
                        break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    raise SystemExit(f"Kafka node {n.node_id} not ready in {self.ready_timeout:.0f} s; its log:\n{self.tail(n)}")
                time.sleep(0.1)

    def tail(self, node, lines=30):
        try:
            return "\n".join(node.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def node(self, node_id):
        return next(n for n in self.nodes if n.node_id == node_id)

    def coordinator_of(self, group):
        """The node id FindCoordinator names for `group`, asked of any live node."""
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                try:
                    err, node, _, _ = find_coordinator(n.address, group)
                except OSError:
                    continue
                if err == 0:
                    return node
        raise RuntimeError(f"no live node names a coordinator for {group}")

    def signal(self, node_id, sig):
        n = self.node(node_id)
        if n.proc is not None and n.proc.poll() is None:
            os.kill(n.proc.pid, sig)

    def kill(self, node_id):
        self.signal(node_id, signal.SIGKILL)
        self.node(node_id).proc.wait()

    def rss_kib(self):
        out = {}
        for n in self.nodes:
            try:
                status = Path(f"/proc/{n.proc.pid}/status").read_text()
                out[n.node_id] = int(next(l.split()[1] for l in status.splitlines() if l.startswith("VmRSS:")))
            except (OSError, StopIteration, AttributeError):
                pass
        return out

    def stop(self):
        # SIGKILL: the data is thrown away, and a controlled shutdown can wait minutes for a
        # controller quorum that is already gone.
        for n in self.nodes:
            if n.proc is not None and n.proc.poll() is None:
                n.proc.kill()
                n.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1, choices=[1, 3])
    ap.add_argument("--initial-delay-ms", type=int, default=3000,
                    help="group.initial.rebalance.delay.ms (Kafka's default: 3000)")
    ap.add_argument("--append-linger-ms", type=int, default=None,
                    help="group.coordinator.append.linger.ms (Apache 4.x's default: 5): how long "
                         "every group-coordinator write waits to batch with others")
    args = ap.parse_args()
    kafka = LocalKafka(nodes=args.nodes, initial_delay_ms=args.initial_delay_ms,
                       extra=linger_config(args.append_linger_ms))
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda *_: done.set())
    try:
        kafka.start()
        print(f"bootstrap={kafka.bootstrap}", flush=True)
        print(f"started_s={kafka.startup_seconds:.1f}", flush=True)
        # EOF on stdin means whoever started us is gone.
        threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
        done.wait()
    finally:
        kafka.stop()


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Capture real Kafka response bodies from tansu for the golden tests (testdata/frames/).

Starts its own tansu on a loopback port, puts a recording TCP proxy in front of it (tansu
advertises the proxy's address, so every connection a client opens, including the coordinator
connection, goes through the proxy), then runs two scenarios:

  tansu       hand-built requests for every API and version kafka-lock uses
  librdkafka  confluent-kafka consumers joining, rebalancing, heartbeating and leaving a group,
              and an AdminClient listing and describing groups

For every response to one of the APIs kafka-lock decodes, the proxy writes
testdata/frames/<source>/<api>_v<version>_<case>.bin holding the RESPONSE BODY ONLY: no length
prefix, no response header (header v1, used by flexible versions except ApiVersions, ends with a
tagged-field section that is stripped too). This is exactly what
`kafka_lock::internals::wire::decode_response(api_key, version, body)` takes. <case> comes from the request's
client id when it starts with "capture." (the hand-built requests), else it is a sequence number.
An index.json beside the files records api key, version, header versions, correlation id and
client id of each, plus counts of the requests that were forwarded but not saved.

Usage (after scripts/install-test-deps.sh):
    .tools/venv/bin/python scripts/capture_frames.py [--source tansu|librdkafka|all] [--out DIR]
"""

import argparse
import asyncio
import ctypes
import json
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

REPO = Path(__file__).resolve().parent.parent

# API key -> (file name, first flexible version). Only these responses are saved.
APIS = {
    18: ("api_versions", 3),
    3: ("metadata", 9),
    10: ("find_coordinator", 3),
    11: ("join_group", 6),
    14: ("sync_group", 4),
    12: ("heartbeat", 4),
    13: ("leave_group", 4),
    15: ("describe_groups", 5),
    8: ("offset_commit", 8),
    9: ("offset_fetch", 6),
}
API_VERSIONS = 18


def flexible(api_key, version):
    return version >= APIS[api_key][1]


def request_header_version(api_key, version):
    return 2 if flexible(api_key, version) else 1


def response_header_version(api_key, version):
    # ApiVersions answers with header v0 at every version, so a client that does not yet know
    # the broker's versions can always read the answer.
    if api_key == API_VERSIONS:
        return 0
    return 1 if flexible(api_key, version) else 0


# --- primitive encoding ------------------------------------------------------------------------


def uvarint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def read_uvarint(buf, pos):
    n = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n, pos
        shift += 7


def i8(v):
    return struct.pack(">b", v)


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def i64(v):
    return struct.pack(">q", v)


def boolean(v):
    return b"\x01" if v else b"\x00"


class Enc:
    """Encodes strings, bytes and arrays in the classic or the flexible (compact) form."""

    def __init__(self, flex):
        self.flex = flex

    def string(self, s):
        b = s.encode()
        return uvarint(len(b) + 1) + b if self.flex else i16(len(b)) + b

    def nstring(self, s):
        if s is None:
            return uvarint(0) if self.flex else i16(-1)
        return self.string(s)

    def bytes_(self, b):
        return uvarint(len(b) + 1) + b if self.flex else i32(len(b)) + b

    def array(self, items):
        items = list(items)
        head = uvarint(len(items) + 1) if self.flex else i32(len(items))
        return head + b"".join(items)

    def narray(self, items):
        if items is None:
            return uvarint(0) if self.flex else i32(-1)
        return self.array(items)

    def tags(self):
        return uvarint(0) if self.flex else b""


# --- request bodies ----------------------------------------------------------------------------


def api_versions_body(v):
    e = Enc(v >= 3)
    if v < 3:
        return b""
    return e.string("kafka-lock-capture") + e.string("1.0") + e.tags()


def metadata_body(v, topics):
    e = Enc(v >= 9)

    def topic(name):
        if v >= 10:
            return bytes(16) + e.nstring(name) + e.tags()
        return e.string(name) + e.tags()

    body = (e.array if v == 0 else e.narray)([topic(t) for t in topics])
    if v >= 4:
        body += boolean(False)  # allow_auto_topic_creation
    if 8 <= v <= 10:
        body += boolean(False)  # include_cluster_authorized_operations
    if v >= 8:
        body += boolean(False)  # include_topic_authorized_operations
    return body + e.tags()


def find_coordinator_body(v, keys):
    e = Enc(v >= 3)
    if v <= 3:
        body = e.string(keys[0])
        if v >= 1:
            body += i8(0)  # key_type: group
    else:
        body = i8(0) + e.array([e.string(k) for k in keys])
    return body + e.tags()


def join_group_body(v, group, member_id, protocols, session_ms, protocol_type="consumer"):
    e = Enc(v >= 6)
    body = e.string(group) + i32(session_ms)
    if v >= 1:
        body += i32(session_ms)  # rebalance_timeout_ms
    body += e.string(member_id)
    if v >= 5:
        body += e.nstring(None)  # group_instance_id
    body += e.string(protocol_type)
    body += e.array([e.string(name) + e.bytes_(meta) + e.tags() for name, meta in protocols])
    if v >= 8:
        body += e.nstring(None)  # reason
    return body + e.tags()


def sync_group_body(v, group, generation, member_id, assignments, protocol="range"):
    e = Enc(v >= 4)
    body = e.string(group) + i32(generation) + e.string(member_id)
    if v >= 3:
        body += e.nstring(None)
    if v >= 5:
        body += e.nstring("consumer") + e.nstring(protocol)
    body += e.array([e.string(m) + e.bytes_(a) + e.tags() for m, a in assignments])
    return body + e.tags()


def heartbeat_body(v, group, generation, member_id):
    e = Enc(v >= 4)
    body = e.string(group) + i32(generation) + e.string(member_id)
    if v >= 3:
        body += e.nstring(None)
    return body + e.tags()


def leave_group_body(v, group, member_ids):
    e = Enc(v >= 4)
    body = e.string(group)
    if v <= 2:
        body += e.string(member_ids[0])
    else:
        members = []
        for m in member_ids:
            item = e.string(m) + e.nstring(None)
            if v >= 5:
                item += e.nstring(None)  # reason
            members.append(item + e.tags())
        body += e.array(members)
    return body + e.tags()


def describe_groups_body(v, groups):
    e = Enc(v >= 5)
    body = e.array([e.string(g) for g in groups])
    if v >= 3:
        body += boolean(False)  # include_authorized_operations
    return body + e.tags()


def offset_commit_body(v, group, generation, member_id, topic, offset):
    e = Enc(v >= 8)
    body = e.string(group) + i32(generation) + e.string(member_id)
    if v >= 7:
        body += e.nstring(None)
    if v <= 4:
        body += i64(-1)  # retention_time_ms: broker default
    partition = i32(0) + i64(offset)
    if v >= 6:
        partition += i32(-1)  # committed_leader_epoch
    partition += e.nstring("captured") + e.tags()
    body += e.array([e.string(topic) + e.array([partition]) + e.tags()])
    return body + e.tags()


def offset_fetch_body(v, group, member_id, generation, topic):
    e = Enc(v >= 6)
    topics = [e.string(topic) + e.array([i32(0)]) + e.tags()]
    if v <= 7:
        body = e.string(group) + (e.array if v < 2 else e.narray)(topics)
    else:
        entry = e.string(group)
        if v >= 9:
            entry += e.nstring(member_id) + i32(generation)
        entry += e.narray(topics) + e.tags()
        body = e.array([entry])
    if v >= 7:
        body += boolean(False)  # require_stable
    return body + e.tags()


def consumer_subscription(topic):
    # ConsumerProtocolSubscription v0: version, topics, user_data (null).
    e = Enc(False)
    return i16(0) + e.array([e.string(topic)]) + i32(-1)


def consumer_assignment(topic, partitions):
    # ConsumerProtocolAssignment v0: version, [topic, [partition]], user_data (null).
    e = Enc(False)
    return i16(0) + e.array([e.string(topic) + e.array([i32(p) for p in partitions])]) + i32(-1)


# --- response parsing (only what the scenarios need to continue) --------------------------------


class Dec:
    def __init__(self, buf, flex):
        self.buf, self.pos, self.flex = buf, 0, flex

    def int(self, fmt):
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def nstring(self):
        if self.flex:
            n, self.pos = read_uvarint(self.buf, self.pos)
            n -= 1
        else:
            n = self.int(">h")
        if n < 0:
            return None
        s = self.buf[self.pos : self.pos + n].decode()
        self.pos += n
        return s


def parse_join_group(v, body):
    d = Dec(body, v >= 6)
    if v >= 2:
        d.int(">i")
    error, generation = d.int(">h"), d.int(">i")
    if v >= 7:
        d.nstring()  # protocol_type
    d.nstring()  # protocol_name
    leader = d.nstring()
    if v >= 9:
        d.int(">b")  # skip_assignment
    member_id = d.nstring()
    return error, generation, leader, member_id


def parse_error_code(v, body, has_throttle_from):
    return struct.unpack_from(">h", body, 4 if v >= has_throttle_from else 0)[0]


# --- the recording proxy -------------------------------------------------------------------------


def strip_response_header(frame, header_version):
    """Returns (correlation_id, body) of a response frame without its length prefix."""
    (correlation_id,) = struct.unpack_from(">i", frame, 0)
    pos = 4
    if header_version >= 1:
        count, pos = read_uvarint(frame, pos)
        for _ in range(count):
            _tag, pos = read_uvarint(frame, pos)
            size, pos = read_uvarint(frame, pos)
            pos += size
    return correlation_id, frame[pos:]


class Recorder:
    """Writes response bodies of one source into out_dir and keeps its index."""

    def __init__(self, out_dir):
        self.out_dir = out_dir
        self.entries = []
        self.not_saved = {}
        self.seq = {}
        self.names = set()
        out_dir.mkdir(parents=True, exist_ok=True)
        for old in out_dir.glob("*.bin"):
            old.unlink()

    def record(self, conn_no, api_key, version, correlation_id, client_id, frame):
        if api_key not in APIS:
            key = f"{api_key}_v{version}"
            self.not_saved[key] = self.not_saved.get(key, 0) + 1
            return
        name = APIS[api_key][0]
        hv = response_header_version(api_key, version)
        _, body = strip_response_header(frame, hv)
        if client_id and client_id.startswith("capture."):
            case = client_id[len("capture.") :]
            file = f"{name}_v{version}_{case}.bin"
            if file in self.names:
                return  # the first answer for a case is the one kept
        else:
            n = self.seq.get((api_key, version), 0) + 1
            self.seq[(api_key, version)] = n
            file = f"{name}_v{version}_{n}.bin"
        self.names.add(file)
        (self.out_dir / file).write_bytes(body)
        self.entries.append(
            {
                "file": file,
                "api_key": api_key,
                "api_version": version,
                "request_header_version": request_header_version(api_key, version),
                "response_header_version": hv,
                "correlation_id": correlation_id,
                "client_id": client_id,
                "connection": conn_no,
                "body_bytes": len(body),
            }
        )

    def write_index(self, meta):
        index = dict(meta)
        index["format"] = (
            "each .bin file is a response body: no 4-byte length prefix, no response header"
        )
        index["files"] = sorted(self.entries, key=lambda e: e["file"])
        index["forwarded_not_saved"] = dict(sorted(self.not_saved.items()))
        (self.out_dir / "index.json").write_text(json.dumps(index, indent=1) + "\n")


def hide_api_keys(frame, version, hidden):
    """Rewrites an ApiVersions response frame (header v0, no length prefix) without `hidden`."""
    flex = version >= 3
    pos = 4 + 2  # correlation id, error code
    if flex:
        count, pos = read_uvarint(frame, pos)
        count -= 1
    else:
        (count,) = struct.unpack_from(">i", frame, pos)
        pos += 4
    kept = []
    for _ in range(count):
        start = pos
        (api_key,) = struct.unpack_from(">h", frame, pos)
        pos += 6
        if flex:
            tags, pos = read_uvarint(frame, pos)
            assert tags == 0, "tagged fields inside ApiVersions entries are not expected"
        if api_key not in hidden:
            kept.append(frame[start:pos])
    head = uvarint(len(kept) + 1) if flex else i32(len(kept))
    return frame[:6] + head + b"".join(kept) + frame[pos:]


class Proxy:
    """A loopback TCP proxy in its own thread, recording into whichever Recorder is current.

    `hide_apis` maps a client id to API keys removed from the ApiVersions answers that client
    sees (the recorded bytes stay as tansu sent them): it steers librdkafka onto an older API.
    """

    def __init__(self, upstream_port):
        self.upstream_port = upstream_port
        self.hide_apis = {}
        self.recorder = None
        self.conn_no = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.port = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        if not self.ready.wait(10):
            raise RuntimeError("proxy did not start")

    def _run(self):
        asyncio.set_event_loop(self.loop)
        server = self.loop.run_until_complete(asyncio.start_server(self._client, "127.0.0.1", 0))
        self.port = server.sockets[0].getsockname()[1]
        self.ready.set()
        self.loop.run_forever()

    async def _client(self, creader, cwriter):
        self.conn_no += 1
        conn_no = self.conn_no
        try:
            breader, bwriter = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            cwriter.close()
            return
        pending = {}

        async def upstream():
            try:
                while True:
                    size = struct.unpack(">i", await creader.readexactly(4))[0]
                    frame = await creader.readexactly(size)
                    api_key, version, corr, cid_len = struct.unpack_from(">hhih", frame, 0)
                    cid = frame[10 : 10 + cid_len].decode() if cid_len >= 0 else None
                    pending[corr] = (api_key, version, cid)
                    bwriter.write(struct.pack(">i", size) + frame)
                    await bwriter.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                bwriter.close()

        async def downstream():
            try:
                while True:
                    size = struct.unpack(">i", await breader.readexactly(4))[0]
                    frame = await breader.readexactly(size)
                    (corr,) = struct.unpack_from(">i", frame, 0)
                    api_key, version, cid = pending.pop(corr, (None, None, None))
                    if api_key is not None and self.recorder is not None:
                        self.recorder.record(conn_no, api_key, version, corr, cid, frame)
                    if api_key == API_VERSIONS and cid in self.hide_apis:
                        frame = hide_api_keys(frame, version, self.hide_apis[cid])
                        size = len(frame)
                    cwriter.write(struct.pack(">i", size) + frame)
                    await cwriter.drain()
            except (asyncio.IncompleteReadError, ConnectionError):
                pass
            finally:
                cwriter.close()

        await asyncio.gather(upstream(), downstream())


# --- the broker ---------------------------------------------------------------------------------


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def tansu_path():
    p = os.environ.get("KAFKA_LOCK_TANSU") or str(REPO / ".tools/bin/tansu")
    if not os.access(p, os.X_OK):
        sys.exit(f"tansu not found at {p}: run scripts/install-test-deps.sh")
    return p


def die_with_parent():
    # The capture script is single-threaded when it starts tansu, so the parent-death signal
    # fires only when this process ends.
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class Tansu:
    def __init__(self, advertised_port, log):
        self.port = free_port()
        env = {
            k: v
            for k, v in os.environ.items()
            if k not in ("CLUSTER_ID", "LISTENER_URL", "ADVERTISED_LISTENER_URL", "STORAGE_ENGINE")
        }
        env["RUST_LOG"] = "warn"
        self.proc = subprocess.Popen(
            [
                tansu_path(),
                "broker",
                "--listener-url",
                f"tcp://127.0.0.1:{self.port}",
                "--advertised-listener-url",
                f"tcp://127.0.0.1:{advertised_port}",
                "--storage-engine",
                "memory://tansu/",
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            preexec_fn=die_with_parent,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("tansu did not start; see its log")
                time.sleep(0.02)

    def create_topic(self, name, partitions=1):
        subprocess.run(
            [tansu_path(), "topic", "create", name, "--partitions", str(partitions)]
            + ["--broker", f"tcp://127.0.0.1:{self.port}"],
            check=True,
            stdout=subprocess.DEVNULL,
        )

    def version(self):
        return subprocess.run(
            [tansu_path(), "--version"], capture_output=True, text=True, check=True
        ).stdout.strip()

    def stop(self):
        self.proc.kill()
        self.proc.wait()


# --- scenario: hand-built requests ---------------------------------------------------------------


class RawClient:
    def __init__(self, port):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.corr = 0

    def call(self, api_key, version, body, case):
        """Sends one request and returns the response body (header stripped)."""
        self.corr += 1
        client_id = f"capture.{case}".encode()
        header = i16(api_key) + i16(version) + i32(self.corr) + i16(len(client_id)) + client_id
        if request_header_version(api_key, version) >= 2:
            header += uvarint(0)
        frame = header + body
        self.sock.sendall(i32(len(frame)) + frame)
        size = struct.unpack(">i", self._read(4))[0]
        corr, body = strip_response_header(
            self._read(size), response_header_version(api_key, version)
        )
        assert corr == self.corr, f"correlation id {corr}, expected {self.corr}"
        return body

    def _read(self, n):
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("broker closed the connection")
            buf += chunk
        return buf

    def close(self):
        self.sock.close()


def join(port, v, group, protocols, session_ms, case_prefix="", joined="leader"):
    """JoinGroup from scratch (KIP-394: MEMBER_ID_REQUIRED, then rejoin with the given id)."""
    c = RawClient(port)
    try:
        body = c.call(11, v, join_group_body(v, group, "", protocols, session_ms),
                      f"{case_prefix}member_id_required")
        error, _, _, member_id = parse_join_group(v, body)
        assert error == 79, f"JoinGroup v{v}: expected MEMBER_ID_REQUIRED, got {error}"
        body = c.call(11, v, join_group_body(v, group, member_id, protocols, session_ms),
                      f"{case_prefix}{joined}")
        return parse_join_group(v, body)
    finally:
        c.close()


def scenario_tansu(proxy_port, broker):
    topic = "capture-topic"
    broker.create_topic(topic, 1)
    c = RawClient(proxy_port)
    for v in range(0, 5):
        c.call(18, v, api_versions_body(v), "basic")
    for v in range(0, 13):
        c.call(3, v, metadata_body(v, [topic]), "one_topic")
    c.call(3, 12, metadata_body(12, ["capture-missing-topic"]), "unknown_topic")
    for v in range(0, 7):
        keys = ["capture-group-0", "capture-group-1"] if v >= 4 else ["capture-group-0"]
        c.call(10, v, find_coordinator_body(v, keys), "group")

    session_ms = 2000  # tansu holds each JoinGroup about session/2
    protocols = [("range", consumer_subscription(topic))]
    for jv in range(0, 10):
        group = f"capture-group-{jv}"
        error, generation, leader, member = join(proxy_port, jv, group, protocols, session_ms)
        assert error == 0 and leader == member, (jv, error, leader, member)
        sv, hv, lv, dv = min(jv, 5), min(jv, 4), min(jv, 5), min(jv, 5)
        body = c.call(14, sv, sync_group_body(sv, group, generation, member,
                                              [(member, consumer_assignment(topic, [0]))]),
                      "leader")
        assert parse_error_code(sv, body, 1) == 0
        c.call(12, hv, heartbeat_body(hv, group, generation, member), "none")
        c.call(12, hv, heartbeat_body(hv, group, generation + 1, member), "illegal_generation")
        c.call(12, hv, heartbeat_body(hv, group, generation, "capture-ghost"), "unknown_member")
        c.call(12, hv, heartbeat_body(hv, "capture-no-such-group", 0, member), "unknown_group")
        if jv >= 2:
            c.call(8, jv, offset_commit_body(jv, group, generation, member, topic, 42), "stable")
        if jv >= 1:
            c.call(9, jv, offset_fetch_body(jv, group, member, generation, topic), "committed")
        c.call(15, dv, describe_groups_body(dv, [group, "capture-no-such-group"]),
               "stable_and_missing")
        members = [member] if lv <= 2 else [member, "capture-ghost"]
        c.call(13, lv, leave_group_body(lv, group, members), "leader")
    # A member that has left is unknown to the group.
    c.call(12, 4, heartbeat_body(4, "capture-group-9", generation, member), "after_leave")

    # A leader and a follower joining together, then syncing (v9 / v5).
    group = "capture-group-pair"
    results = {}

    def run(name):
        results[name] = join(proxy_port, 9, group, protocols, 6000, case_prefix=f"pair_{name}_",
                             joined="joined")

    threads = [threading.Thread(target=run, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    (ea, ga, la, ma), (eb, gb, lb, mb) = results["a"], results["b"]
    assert ea == eb == 0 and ga == gb and la == lb, results
    leader, follower = (ma, mb) if la == ma else (mb, ma)
    assignments = [(leader, consumer_assignment(topic, [0])), (follower, consumer_assignment(topic, []))]
    follower_result = {}

    def follower_sync():
        fc = RawClient(proxy_port)
        follower_result["body"] = fc.call(14, 5, sync_group_body(5, group, ga, follower, []),
                                          "follower")
        fc.close()

    t = threading.Thread(target=follower_sync)
    t.start()
    c.call(14, 5, sync_group_body(5, group, ga, leader, assignments), "pair_leader")
    t.join()
    c.call(15, 5, describe_groups_body(5, [group]), "pair_stable")
    # A third member arriving moves the formed group to a new generation: the members'
    # heartbeats with the old one are answered REBALANCE_IN_PROGRESS.
    body = c.call(11, 9, join_group_body(9, group, "", protocols, 6000), "pair_c_member_id_required")
    third = parse_join_group(9, body)[3]
    c.call(12, 4, heartbeat_body(4, group, ga, leader), "rebalance_in_progress")
    c.call(13, 5, leave_group_body(5, group, [leader, follower, third]), "pair")

    # A second protocol type on a formed group is refused.
    group = "capture-group-inconsistent"
    join(proxy_port, 9, group, protocols, session_ms, case_prefix="first_")
    join_body = join_group_body(9, group, "", [("roundrobin", b"")], session_ms, "other")
    body = c.call(11, 9, join_body, "second_member_id_required")
    _, _, _, other = parse_join_group(9, body)
    join_body = join_group_body(9, group, other, [("roundrobin", b"")], session_ms, "other")
    c.call(11, 9, join_body, "inconsistent_group_protocol")
    c.close()


# --- scenario: librdkafka ------------------------------------------------------------------------


def scenario_librdkafka(proxy, broker):
    from confluent_kafka import Consumer
    from confluent_kafka.admin import AdminClient

    topic, group = "capture-rdkafka-topic", "capture-rdkafka-group"
    broker.create_topic(topic, 1)
    bootstrap = f"127.0.0.1:{proxy.port}"
    events = []

    def consumer(name):
        c = Consumer({
            "bootstrap.servers": bootstrap,
            "client.id": name,
            "group.id": group,
            "session.timeout.ms": 6000,
            "heartbeat.interval.ms": 1000,
            "partition.assignment.strategy": "range",
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
        })

        def on_assign(_c, parts):
            events.append((name, "assign", [p.partition for p in parts]))

        def on_revoke(_c, parts):
            events.append((name, "revoke", [p.partition for p in parts]))

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    def poll_until(consumers, cond, bound):
        deadline = time.monotonic() + bound
        while not cond():
            if time.monotonic() > deadline:
                raise RuntimeError(f"timed out; events so far: {events}")
            for c in consumers:
                c.poll(0.1)

    c1 = consumer("c1")
    poll_until([c1], lambda: ("c1", "assign", [0]) in events, 60)
    # Let a few heartbeats go by (heartbeat.interval.ms = 1000).
    end = time.monotonic() + 3.5
    while time.monotonic() < end:
        c1.poll(0.1)
    c2 = consumer("c2")
    poll_until([c1, c2], lambda: sum(1 for e in events if e[1] == "assign") >= 3, 60)
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        c1.poll(0.1)
        c2.poll(0.1)

    admin = AdminClient({"bootstrap.servers": bootstrap, "client.id": "admin"})
    admin.list_consumer_groups().result(timeout=30)
    admin.describe_consumer_groups([group])[group].result(timeout=30)
    # librdkafka describes with ConsumerGroupDescribe (API 69) when the broker offers it, and
    # tansu does; a client that does not see API 69 falls back to the classic DescribeGroups.
    proxy.hide_apis["admin-classic"] = {69}
    classic = AdminClient({"bootstrap.servers": bootstrap, "client.id": "admin-classic"})
    desc = classic.describe_consumer_groups([group])[group].result(timeout=30)
    events.append(("admin-classic", "described", [str(desc.state), len(desc.members)]))

    c2.close()
    c1.close()
    return events


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--source", choices=["tansu", "librdkafka", "all"], default="all")
    ap.add_argument("--out", type=Path, default=REPO / "testdata/frames")
    args = ap.parse_args()

    log = tempfile.NamedTemporaryFile(prefix="capture-tansu-", suffix=".log", delete=False)
    proxy = None
    broker = None
    try:
        # tansu must advertise the proxy, and the proxy must know tansu's port: reserve the
        # proxy's port by starting it against a placeholder, then point it at tansu.
        proxy = Proxy(upstream_port=0)
        broker = Tansu(advertised_port=proxy.port, log=log)
        proxy.upstream_port = broker.port
        sources = ["tansu", "librdkafka"] if args.source == "all" else [args.source]
        for source in sources:
            rec = Recorder(args.out / source)
            proxy.recorder = rec
            meta = {
                "source": source,
                "broker": broker.version(),
                "captured_by": "scripts/capture_frames.py",
                "captured_on": time.strftime("%Y-%m-%d", time.gmtime()),
            }
            if source == "tansu":
                scenario_tansu(proxy.port, broker)
            else:
                import confluent_kafka

                meta["client"] = (
                    f"confluent-kafka {confluent_kafka.version()} / "
                    f"librdkafka {confluent_kafka.libversion()[0]}"
                )
                meta["events"] = scenario_librdkafka(proxy, broker)
            # Responses are recorded before they are forwarded, so everything a client has
            # received is on disk by now.
            proxy.recorder = None
            rec.write_index(meta)
            total = sum(e["body_bytes"] for e in rec.entries)
            print(f"{source}: {len(rec.entries)} files, {total} bytes -> {rec.out_dir}")
    except BaseException:
        log.flush()
        print(f"tansu log: {log.name}", file=sys.stderr)
        raise
    finally:
        if broker is not None:
            broker.stop()
    os.unlink(log.name)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Writes the seed inputs of the fuzz corpora and the hand-written hazard inputs of regressions/.

Run from anywhere: python3 fuzz/make_seeds.py. It only adds or overwrites its own files
(seed-*, hazard-*); minimised corpus files and crash inputs are left alone. Input layouts are
described in fuzz/targets.rs and docs/fuzzing.md. One more set of response seeds, a valid generated
body for every supported (API, version), comes from
`cargo test --lib fuzz_replay::write_generated_seeds -- --ignored`, and the seeds and hazards of
record_batch_decode (which need kafka-lock's batch encoder and CRC-32C) from
`cargo test --lib fuzz_replay::write_record_batch_seeds -- --ignored`.
"""

import json
import pathlib
import struct

FUZZ = pathlib.Path(__file__).resolve().parent
FRAMES = FUZZ.parent / "testdata" / "frames"


def write(kind, target, name, data):
    d = FUZZ / kind / target
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_bytes(bytes(data))


def i16(v):
    return struct.pack(">h", v)


def i32(v):
    return struct.pack(">i", v)


def kstr(s):
    b = s.encode()
    return i16(len(b)) + b


def uvarint(v):
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        if v:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def captured():
    """(source, index entry, body) for every captured response body."""
    for source in sorted(p.name for p in FRAMES.iterdir() if p.is_dir()):
        index = json.loads((FRAMES / source / "index.json").read_text())
        for entry in index["files"]:
            body = (FRAMES / source / entry["file"]).read_bytes()
            yield source, entry, body


def response_seeds():
    for source, e, body in captured():
        stem = f"seed-{source}-{e['file'].removesuffix('.bin')}"
        selector = bytes([e["api_key"], e["api_version"] & 0xFF])
        write("corpus", "response_decode", stem, selector + body)
        # The same bytes as a frame body: correlation id, then the tagged-field count of
        # response header v1.
        header = i32(e["correlation_id"]) + (b"\x00" if e["response_header_version"] == 1 else b"")
        write("corpus", "response_decode", stem + "-framed", selector + header + body)


def frame_seeds():
    # From the tansu and librdkafka captures only, which the frame seeds were first made from:
    # the Apache captures would change them without reaching anything new in the framing code.
    bodies = [body for source, _, body in captured() if source != "apache"]
    small = [b for b in bodies if len(b) <= 200][:6]
    stream = b"".join(i32(len(b)) + b for b in small)
    write("corpus", "frame_decode", "seed-six-frames-64k", b"\x00" + stream)
    write("corpus", "frame_decode", "seed-six-frames-256", b"\x05" + stream)
    write("corpus", "frame_decode", "seed-frames-then-partial", b"\x08" + stream + i32(40) + b"x" * 10)
    write("corpus", "frame_decode", "seed-exact-limit-16", b"\x02" + i32(16) + bytes(range(16)) + i32(17))
    write("corpus", "frame_decode", "seed-one-byte-frames", b"\x03" + (i32(1) + b"z") * 5)


def member_metadata(holds, first, holder, label=None, minor=0, flags=None, extra=b""):
    f = (1 if holds else 0) if flags is None else flags
    lab = b"\xff\xff" if label is None else kstr(label)
    return b"km" + bytes([1, minor, f]) + i32(first) + i32(holder) + lab + extra


def native_assignment(position, members, holder=None, minor=0, extra=b""):
    out = b"ka" + bytes([1, minor, 1 if holder else 0]) + i32(position) + i32(members)
    if holder:
        gen, mid, label = holder
        out += i32(gen) + kstr(mid) + (b"\xff\xff" if label is None else kstr(label))
    return out + extra


def subscription(version, topics, user=b"", owned=(), generation=-1, rack=None):
    out = i16(version) + i32(len(topics)) + b"".join(kstr(t) for t in topics) + i32(len(user)) + user
    if version >= 1:
        out += i32(len(owned))
        for topic, parts in owned:
            out += kstr(topic) + i32(len(parts)) + b"".join(i32(p) for p in parts)
    if version >= 2:
        out += i32(generation)
    if version >= 3:
        out += i16(-1) if rack is None else kstr(rack)
    return out


def consumer_assignment(version, assigned, user=b""):
    out = i16(version) + i32(len(assigned))
    for topic, parts in assigned:
        out += kstr(topic) + i32(len(parts)) + b"".join(i32(p) for p in parts)
    return out + i32(len(user)) + user


def peer_seeds():
    seeds = {
        "metadata-waiter": member_metadata(False, 3, -1),
        "metadata-holder-label": member_metadata(True, 1, 7, "host-a pid 42 nightly"),
        "metadata-newer-minor": member_metadata(True, 2, 5, None, minor=3, flags=0x81, extra=b"future"),
        "assignment-holder": native_assignment(0, 3, (9, "member-1", "job-1")),
        "assignment-waiter": native_assignment(2, 3, (9, "member-1", None)),
        "assignment-no-holder": native_assignment(-1, 1),
        "subscription-v0": subscription(0, ["t"]),
        "subscription-v1": subscription(1, ["t", "other"], b"ud", [("t", [0])]),
        "subscription-v3": subscription(3, ["t"], b"", [("t", [0])], 4, "rack-1"),
        "consumer-assignment-v0": consumer_assignment(0, [("t", [0])]),
        "consumer-assignment-v3": consumer_assignment(3, [("t", [0, 1]), ("u", [])], b"x"),
    }
    for name, data in seeds.items():
        write("corpus", "peer_bytes", "seed-" + name, data)
    # Member lists (see split_members in fuzz/targets.rs): generation, then per member a header
    # byte and its metadata.
    raw = member_metadata(True, 2, 4, "raw")
    members = (
        b"\x05"
        + b"\x11\x01\x03\x02"  # valid native metadata: holds, first 3, holder 2
        + b"\x12\x00\x01\xff"  # never joined
        + b"\x1b\x03\x00\x00"  # static member, holds with holder generation 0
        + b"\x00" + bytes([len(raw)]) + raw
        + b"\x07\x03bad"
    )
    write("corpus", "peer_bytes", "seed-native-members", members)
    consumers = b"\x01" + b"\x21\x6c\x2d\x25" + b"\x00" + bytes([9]) + subscription(0, [])[:9] + b"\x2b"
    write("corpus", "peer_bytes", "seed-consumer-members", consumers)


def hazards():
    """Inputs for the allocation hazards the design exists to stop (see src/wire/guard.rs)."""
    # Frame prefixes: largest positive length, negative, zero, HTTP and TLS answers.
    write("regressions", "frame_decode", "hazard-max-length", b"\x00" + b"\x7f\xff\xff\xff" + b"x" * 8)
    write("regressions", "frame_decode", "hazard-negative-length", b"\x00\xff\xff\xff\xfe")
    write("regressions", "frame_decode", "hazard-zero-length", b"\x01" + i32(0) + i32(1) + b"a")
    write("regressions", "frame_decode", "hazard-http", b"\x00HTTP/1.1 400 Bad Request\r\n\r\n")
    write("regressions", "frame_decode", "hazard-tls-alert", b"\x00\x15\x03\x03\x00\x02\x02\x46")

    # JoinGroup v5 claiming 2^31-1 members: kafka-protocol alone would reserve ~2^31 x 80 bytes.
    jg5 = i32(0) + i16(0) + i32(1) + kstr("range") + kstr("m") + kstr("m") + i32(0x7FFFFFFF)
    write("regressions", "response_decode", "hazard-join-group-v5-member-count", b"\x0b\x05" + jg5)
    # JoinGroup v9 (flexible): the same claim as a compact array varint.
    jg9 = (i32(0) + i16(0) + i32(1) + b"\x02t" + b"\x02r" + b"\x02m" + b"\x00" + b"\x02m"
           + uvarint(0xFFFFFFFF) + b"\x00")
    write("regressions", "response_decode", "hazard-join-group-v9-member-count", b"\x0b\x09" + jg9)
    # Metadata v1 claiming 2^31-1 brokers; the header form exercises decode_response_frame too.
    md1 = i32(0x7FFFFFFF) + b"\x00" * 8
    write("regressions", "response_decode", "hazard-metadata-v1-broker-count", b"\x03\x01" + md1)
    write("regressions", "response_decode", "hazard-metadata-v1-broker-count-framed", b"\x03\x01" + i32(7) + md1)
    # DescribeGroups v0: member metadata bytes claiming 2 GiB.
    dg0 = i32(1) + i16(0) + kstr("g") + kstr("Stable") + kstr("consumer") + kstr("range") + i32(1) \
        + kstr("m") + kstr("c") + kstr("h") + i32(0x7FFFFFFF)
    write("regressions", "response_decode", "hazard-describe-groups-v0-bytes-length", b"\x0f\x00" + dg0)
    # ApiVersions v3 padded with 20000 empty unknown tagged fields: each costs a BTreeMap entry.
    tags = b"".join(uvarint(10 + t) + b"\x00" for t in range(20000))
    av3 = i16(0) + b"\x01" + i32(0) + uvarint(20000) + tags
    write("regressions", "response_decode", "hazard-api-versions-v3-tag-flood", b"\x12\x03" + av3)
    # SyncGroup v4 with a varint longer than five bytes.
    write("regressions", "response_decode", "hazard-sync-group-v4-long-varint",
          b"\x0e\x04" + i32(0) + i16(0) + b"\xff\xff\xff\xff\xff\xff\x01")

    # Fetch v4 claiming 2^31-1 topics; Fetch v12 whose records claim 4 GiB (a compact length);
    # Produce v9 claiming 2^32-2 partitions. Records are opaque bytes to kafka-protocol, which
    # would copy them; wire::records reads them only once the guard has seen them whole.
    write("regressions", "response_decode", "hazard-fetch-v4-topic-count",
          b"\x01\x04" + i32(0) + i32(0x7FFFFFFF) + b"\x00" * 8)
    partition = i32(0) + i16(0) + b"\x00" * 24 + b"\x00" + i32(-1) + uvarint(0xFFFFFFFF) + b"\x00"
    fetch12 = i32(0) + i16(0) + i32(0) + uvarint(2) + b"\x02t" + uvarint(2) + partition
    write("regressions", "response_decode", "hazard-fetch-v12-records-length", b"\x01\x0c" + fetch12)
    write("regressions", "response_decode", "hazard-produce-v9-partition-count",
          b"\x00\x09" + uvarint(2) + b"\x02t" + uvarint(0xFFFFFFFF) + b"\x00" * 8)

    # Peer bytes: counts and lengths far beyond the input.
    write("regressions", "peer_bytes", "hazard-subscription-topic-count", i16(0) + i32(0x7FFFFFFF))
    write("regressions", "peer_bytes", "hazard-assignment-partition-count",
          i16(0) + i32(1) + kstr("t") + i32(0x7FFFFFFF))
    write("regressions", "peer_bytes", "hazard-metadata-label-length",
          b"km\x01\x00\x00" + i32(1) + i32(-1) + b"\xff\xfe" + b"x" * 4)
    write("regressions", "peer_bytes", "hazard-assignment-member-id-length",
          b"ka\x01\x00\x01" + i32(0) + i32(1) + i32(3) + b"\xff\xff" + b"x" * 4)


if __name__ == "__main__":
    response_seeds()
    frame_seeds()
    peer_seeds()
    hazards()

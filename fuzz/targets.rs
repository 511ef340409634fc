// The checks behind every fuzz target, in one file shared by the libFuzzer binaries
// (`fuzz/fuzz_targets/*.rs`, through `#[path]`) and by the replay test that `cargo test` runs on
// stable (`src/fuzz_replay.rs`, through `include!`), so a committed input is replayed through
// exactly the code the fuzzer ran. The library is named `kafka_lock` here; the replay test
// aliases that name to `crate`. Plain comments only: `include!` rejects inner doc comments.
//
// Each function accepts any bytes. It panics only when the library breaks a promise: a panic,
// an abort or an allocation beyond libFuzzer's `-malloc_limit_mb` inside the library, or one of
// the `assert!`s below, which state what the library's documentation promises about the result.

use std::collections::HashMap;

use bytes::{Bytes, BytesMut};
use kafka_lock::internals::assign::{
    assign_consumer, assign_native, consumer_subscription, decode_consumer_assignment,
    decode_consumer_subscription, fuzz_peer_bytes, ConsumerStrategy, MemberMetadata,
    NativeAssignment,
};
use kafka_lock::internals::wire::codec::{
    decode_response, decode_response_bytes, decode_response_frame, decode_response_frame_bytes,
    peek_correlation_id, DecodeError, Response,
};
use kafka_lock::internals::wire::frame::{decode_frame, frame_length, LENGTH_PREFIX_SIZE};
use kafka_lock::internals::wire::guard::{scan_response, AMPLIFICATION_SLACK, MAX_AMPLIFICATION};
use kafka_lock::internals::wire::records::{
    self, encode_batch, BatchError, Header, NewRecord, Record, RecordBatch, RecordBatches,
    MIN_HEADER_SIZE, MIN_RECORD_SIZE,
};
use kafka_lock::internals::wire::sasl::{
    parse_server_final, parse_server_first, ScramClient, ScramError, ScramHash, MAX_ITERATIONS,
    MIN_ITERATIONS,
};
use kafka_lock::internals::wire::versions::SUPPORTED;
use kafka_protocol::messages::ApiKey;

/// A fuzz target's check: any bytes in, a panic only for a broken promise.
pub type Target = fn(&[u8]);

/// Every target by the name of its corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("frame_decode", frame_decode),
    ("response_decode", response_decode),
    ("peer_bytes", peer_bytes),
    ("record_batch_decode", record_batch_decode),
    ("sasl_scram", sasl_scram),
];

/// The frame limits `frame_decode` picks from: the largest is the "small maximum" a fuzz run can
/// still fill, the others let short inputs reach the limit checks.
pub const FRAME_LIMITS: [usize; 4] = [64 * 1024, 256, 16, 1];

/// Input: one control byte, then a byte stream as a broker would send it.
///
/// The control byte's low two bits pick the frame limit from [`FRAME_LIMITS`]; the rest seeds the
/// sizes of the chunks in which the stream is appended to the read buffer, as a socket would
/// deliver it. Every frame handed out must be exactly the next frame of the stream; an incomplete
/// frame must leave the buffer untouched (no bytes consumed, no capacity reserved); an error must
/// be the one the 4-byte prefix alone calls for.
pub fn frame_decode(data: &[u8]) {
    let Some((&control, stream)) = data.split_first() else {
        return;
    };
    let max = FRAME_LIMITS[usize::from(control & 3)];
    let mut rng = u32::from(control) | 0x100;
    let mut buf = BytesMut::new();
    let mut fed = 0;
    let mut consumed = 0;
    loop {
        if fed < stream.len() {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            let chunk = match rng % 8 {
                0 => stream.len() - fed,
                bits => (rng >> 3) as usize % (1 << bits) + 1,
            };
            let chunk = chunk.min(stream.len() - fed);
            buf.extend_from_slice(&stream[fed..fed + chunk]);
            fed += chunk;
        }
        loop {
            assert_eq!(&buf[..], &stream[consumed..fed]);
            let (len, cap) = (buf.len(), buf.capacity());
            let prefix: Option<[u8; LENGTH_PREFIX_SIZE]> = buf
                .get(..LENGTH_PREFIX_SIZE)
                .map(|p| p.try_into().expect("4 bytes"));
            match decode_frame(&mut buf, max) {
                Ok(Some(frame)) => {
                    let size = frame_length(prefix.expect("a frame has a prefix"), max)
                        .expect("a frame was returned for a valid prefix");
                    assert!((1..=max).contains(&frame.len()));
                    assert_eq!(frame.len(), size);
                    let start = consumed + LENGTH_PREFIX_SIZE;
                    assert_eq!(&frame[..], &stream[start..start + size]);
                    consumed = start + size;
                }
                Ok(None) => {
                    assert_eq!(
                        (buf.len(), buf.capacity()),
                        (len, cap),
                        "waiting changed the buffer"
                    );
                    if let Some(p) = prefix {
                        let size = frame_length(p, max).expect("waiting on a valid prefix");
                        assert!(
                            len - LENGTH_PREFIX_SIZE < size,
                            "a whole frame was left waiting"
                        );
                    }
                    break;
                }
                Err(e) => {
                    assert_eq!(
                        (buf.len(), buf.capacity()),
                        (len, cap),
                        "an error changed the buffer"
                    );
                    let p = prefix.expect("an error needs a whole prefix");
                    assert_eq!(frame_length(p, max), Err(e));
                    // A connection is poisoned by a framing error; nothing after it is read.
                    return;
                }
            }
        }
        if fed == stream.len() {
            break;
        }
    }
}

/// Input: API key (one byte), version (one byte, as `i8`), then the bytes to decode.
///
/// The bytes are decoded both as a bare body ([`decode_response`]) and as a frame body with a
/// response header ([`decode_response_frame`], expecting the correlation id the frame carries),
/// each from a slice and from [`Bytes`]; the two paths must agree. Pairs outside [`SUPPORTED`]
/// must be refused as unsupported; a body the guard accepts must fit the guard's memory budget
/// and must not be one kafka-protocol then finds truncated or too long (that would mean the
/// guard's tables disagree with kafka-protocol's decoders).
pub fn response_decode(data: &[u8]) {
    let [key, version, ref rest @ ..] = *data else {
        return;
    };
    let Ok(api) = ApiKey::try_from(i16::from(key)) else {
        return;
    };
    let version = i16::from(version as i8);
    let supported = SUPPORTED
        .iter()
        .any(|&(a, min, max)| a == api && (min..=max).contains(&version));

    let body = decode_response(api, version, rest);
    let shared = decode_response_bytes(api, version, Bytes::copy_from_slice(rest));
    check_response(api, version, supported, &body, &shared);
    if supported {
        check_guard(api, version, rest, &body);
    }

    let correlation_id = peek_correlation_id(rest).unwrap_or(0);
    let frame = decode_response_frame(rest, api, version, correlation_id);
    let shared =
        decode_response_frame_bytes(Bytes::copy_from_slice(rest), api, version, correlation_id);
    check_response(api, version, supported, &frame, &shared);
}

fn check_response(
    api: ApiKey,
    version: i16,
    supported: bool,
    a: &Result<Response, DecodeError>,
    b: &Result<Response, DecodeError>,
) {
    match (a, b) {
        (Ok(x), Ok(y)) => {
            assert!(supported, "{api:?} v{version} decoded but is not supported");
            assert_eq!(x.api_key(), api);
            assert_eq!(x, y, "slice and Bytes decoding disagree");
        }
        (Err(x), Err(y)) => {
            if !supported {
                assert!(
                    matches!(x, DecodeError::UnsupportedVersion { .. }),
                    "{api:?} v{version}: {x}"
                );
            }
            assert_eq!(
                x.to_string(),
                y.to_string(),
                "slice and Bytes decoding disagree"
            );
        }
        (x, y) => panic!("{api:?} v{version}: slice gave {x:?}, Bytes gave {y:?}"),
    }
    // The records of a Fetch answer are what the ledger reads next: they must be readable too.
    if let Ok(Response::Fetch(f)) = a {
        for p in f.responses.iter().flat_map(|t| &t.partitions) {
            if let Some(data) = &p.records {
                check_batches(data.clone());
            }
        }
    }
}

fn check_guard(api: ApiKey, version: i16, body: &[u8], decoded: &Result<Response, DecodeError>) {
    let Ok(scan) = scan_response(api, version, body) else {
        return;
    };
    assert_eq!(scan.consumed, body.len());
    assert!(
        scan.heap_estimate <= body.len() * MAX_AMPLIFICATION + AMPLIFICATION_SLACK,
        "{api:?} v{version}: a scan passed with estimate {} for {} bytes",
        scan.heap_estimate,
        body.len()
    );
    // An ApiVersions body with error 35 may have been read as v0 instead (KIP-511).
    if api == ApiKey::ApiVersions && body.get(..2) == Some(&[0, 35][..]) {
        return;
    }
    match decoded {
        Err(e @ DecodeError::TrailingBytes { .. }) => {
            panic!(
                "{api:?} v{version}: the guard accepted a body kafka-protocol did not consume: {e}"
            )
        }
        Err(DecodeError::Protocol { source, .. }) => {
            let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(source.as_ref());
            while let Some(c) = cause {
                assert!(
                    !c.to_string().contains("Not enough bytes"),
                    "{api:?} v{version}: the guard accepted a body kafka-protocol found truncated"
                );
                cause = c.source();
            }
        }
        _ => {}
    }
}

/// Input: one control byte, then the bytes of a Fetch answer's `records` field, any number of
/// record batches.
///
/// Control bit 0 set: every batch's CRC is made right before decoding (see [`fix_crcs`]), so
/// mutations reach the record parser instead of stopping at the CRC check; clear: the bytes are
/// decoded as they are, so the CRC check itself is fuzzed.
///
/// Decodes them with [`RecordBatches`] and checks what `wire::records` promises: records and
/// headers no more numerous than the bytes can hold, keys and values shared with the input (no
/// copies), decoded records within the module's amplification bound, and offsets not below their
/// batch's base. Every batch decoded re-encodes, through our encoder, to a batch that decodes to
/// the same records. Cutting the input short yields a prefix of the same items, never an error
/// the whole input did not have: a cut batch only ends the iteration.
pub fn record_batch_decode(data: &[u8]) {
    let Some((&control, data)) = data.split_first() else {
        return;
    };
    let mut data = BytesMut::from(data);
    if control & 1 != 0 {
        fix_crcs(&mut data);
    }
    let data = data.freeze();
    let items = check_batches(data.clone());
    for cut in [data.len().saturating_sub(1), data.len() / 2] {
        let shorter = collect_batches(data.slice(..cut)).0;
        assert!(shorter.len() <= items.len(), "a cut input yielded more items");
        assert_eq!(&items[..shorter.len()], &shorter[..], "cut at {cut}");
    }
    for batch in items.iter().flatten() {
        re_encode(batch);
    }
}

/// Walks the batches the way the decoder does (base offset, length, then the batch) and writes
/// into each complete one the CRC-32C of its bytes from the attributes on.
pub fn fix_crcs(data: &mut [u8]) {
    let mut pos = 0;
    while let Some(prefix) = data.get(pos..pos + 12) {
        let length = i32::from_be_bytes(prefix[8..12].try_into().expect("4 bytes"));
        let Ok(length) = usize::try_from(length) else {
            return;
        };
        let end = pos + 12 + length;
        if length < 9 || end > data.len() {
            return;
        }
        let crc = crc32c::crc32c(&data[pos + 21..end]);
        data[pos + 17..pos + 21].copy_from_slice(&crc.to_be_bytes());
        pos = end;
    }
}

fn collect_batches(data: Bytes) -> (Vec<Result<RecordBatch, BatchError>>, RecordBatches) {
    let mut it = RecordBatches::new(data);
    let items: Vec<_> = it.by_ref().collect();
    assert!(it.next().is_none(), "the iterator is fused");
    (items, it)
}

/// Decodes `data` and checks the promises that hold for any input; returns the items.
fn check_batches(data: Bytes) -> Vec<Result<RecordBatch, BatchError>> {
    let (items, it) = collect_batches(data.clone());
    let within = data.as_ptr_range();
    let shared = |b: &Option<Bytes>| b.as_ref().is_none_or(|b| b.is_empty() || within.contains(&b.as_ptr()));
    let mut heap = 0usize;
    let mut records = 0usize;
    for item in &items {
        match item {
            Ok(batch) => {
                heap += batch.records.capacity() * std::mem::size_of::<Record>() + 32;
                records += batch.records.len();
                for r in &batch.records {
                    assert!(r.offset >= batch.base_offset);
                    assert!(shared(&r.key) && shared(&r.value), "a key or value was copied");
                    assert!(r.headers.len() <= data.len() / MIN_HEADER_SIZE);
                    if r.headers.capacity() > 0 {
                        heap += r.headers.capacity() * std::mem::size_of::<Header>() + 32;
                    }
                    for h in &r.headers {
                        assert!(shared(&h.value), "a header value was copied");
                    }
                }
            }
            Err(e) => {
                let _ = e.to_string();
            }
        }
    }
    assert!(records <= data.len() / MIN_RECORD_SIZE);
    assert!(
        heap <= records::MAX_AMPLIFICATION * data.len() + 64,
        "{heap} heap bytes for {} input bytes",
        data.len()
    );
    if let Some(t) = it.truncated() {
        assert!(t.at + t.available == data.len());
        assert!(t.needed.is_none_or(|n| n > t.available));
    }
    items
}

/// Our encoder takes back what the decoder read: same timestamps, keys, values and headers.
fn re_encode(batch: &RecordBatch) {
    if batch.records.is_empty() {
        return;
    }
    let new: Vec<NewRecord> = batch
        .records
        .iter()
        .map(|r| NewRecord {
            timestamp: r.timestamp,
            key: r.key.clone(),
            value: r.value.clone(),
            headers: r.headers.clone(),
        })
        .collect();
    let mut out = BytesMut::new();
    encode_batch(&new, &mut out).expect("decoded records fit a batch");
    let (again, it) = collect_batches(out.freeze());
    let [Ok(again)] = &again[..] else {
        panic!("our own batch did not decode: {again:?}")
    };
    assert_eq!(it.next_offset(), Some(new.len() as i64));
    for ((a, b), i) in again.records.iter().zip(&batch.records).zip(0..) {
        assert_eq!(a.offset, i);
        assert_eq!((a.timestamp, &a.key, &a.value), (b.timestamp, &b.key, &b.value));
        assert_eq!(a.headers, b.headers);
    }
}

/// Input: the bytes every peer-data decoder reads, and a member list for both assignors.
///
/// First [`fuzz_peer_bytes`] on the whole input. Then canonical round trips: metadata or an
/// assignment that decodes at a minor version this build writes must re-encode to the same bytes.
/// Then the assignors on members split from the input (see [`split_members`]), checked against
/// the rules of `docs/protocol.md`.
pub fn peer_bytes(data: &[u8]) {
    fuzz_peer_bytes(data);
    // Ledger records are written by other members too: decoded strictly, re-encoded exactly, and
    // folded into a history, which must keep its holds in token order.
    kafka_lock::internals::ledger::fuzz_ledger_bytes(data);

    if let Ok(md) = MemberMetadata::decode(data) {
        if data[3] == 0 || (data[3] == 1 && (md.permits != 1 || md.slot != 0)) {
            assert_eq!(
                &md.encode()[..],
                data,
                "member metadata does not round-trip"
            );
        }
    }
    if let Ok(a) = NativeAssignment::decode(data) {
        if data[3] == 0 {
            assert_eq!(&a.encode()[..], data, "assignment does not round-trip");
        }
    }

    let Some((&generation, rest)) = data.split_first() else {
        return;
    };
    let members = split_members(rest);
    check_native(i32::from(generation as i8), &members);
    check_consumer(&members);
}

type Member = (String, Option<String>, Bytes);

/// Up to 16 members from `data`, each one header byte then its metadata.
///
/// Header bits 0-2 pick a member id prefix (chosen so ids sort differently bytewise and in Java's
/// UTF-16 order), bit 3 gives the member a group.instance.id; ids and instance ids end in the
/// member's index so they are unique, as the broker guarantees. Bits 4-5 pick the metadata:
/// 0 and 3: the next byte is a length and that many bytes follow (raw peer bytes); 1: valid native
/// metadata built from the next three bytes; 2: a consumer subscription to "t" or "u".
pub fn split_members(mut data: &[u8]) -> Vec<Member> {
    const PREFIXES: [&str; 8] = ["", "a", "b", "ab", "\u{e000}", "\u{10000}", "m", "z"];
    let mut members = Vec::new();
    while let Some((&header, rest)) = data.split_first() {
        if members.len() == 16 {
            break;
        }
        data = rest;
        let i = members.len();
        let id = format!("{}{i}", PREFIXES[usize::from(header & 7)]);
        let instance =
            (header & 8 != 0).then(|| format!("{}{i}", PREFIXES[usize::from(header >> 5 & 7)]));
        let metadata = match header >> 4 & 3 {
            1 => {
                let b = take(&mut data, 3);
                let byte = |k: usize| b.get(k).copied().unwrap_or(0);
                MemberMetadata {
                    holds: byte(0) & 1 != 0,
                    first_joined_generation: i32::from(byte(1) as i8).max(-1),
                    holder_generation: i32::from(byte(2) as i8).max(-1),
                    label: (byte(0) & 2 != 0).then(|| format!("job-{i}")),
                    // Bit 2: a semaphore of two permits, bit 3 its slot.
                    permits: 1 + u16::from(byte(0) >> 2 & 1),
                    slot: u16::from(byte(0) >> 2 & byte(0) >> 3 & 1),
                    ledger: None,
                }
                .encode()
            }
            2 => consumer_subscription(if header & 0x40 != 0 { "u" } else { "t" }),
            _ => {
                let len = take(&mut data, 1).first().copied().unwrap_or(0);
                Bytes::copy_from_slice(take(&mut data, usize::from(len)))
            }
        };
        members.push((id, instance, metadata));
    }
    members
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> &'a [u8] {
    let (head, tail) = data.split_at(n.min(data.len()));
    *data = tail;
    head
}

/// FIFO order of `docs/protocol.md`: joined members by first generation, then never-joined ones;
/// ties by member id bytes.
fn fifo(id: &str, md: &MemberMetadata) -> (bool, i32, Vec<u8>) {
    (
        md.first_joined_generation < 0,
        md.first_joined_generation,
        id.as_bytes().to_vec(),
    )
}

fn check_native(generation: i32, members: &[Member]) {
    let plan = assign_native(generation, members);
    assert_eq!(plan.assignments.len(), members.len());
    let decoded: Vec<_> = members
        .iter()
        .map(|(_, _, m)| MemberMetadata::decode(m))
        .collect();
    let rejected: Vec<&str> = members
        .iter()
        .zip(&decoded)
        .filter(|(_, d)| d.is_err())
        .map(|((id, _, _), _)| id.as_str())
        .collect();
    let plan_rejected: Vec<&str> = plan.rejected.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(plan_rejected, rejected);

    // Members that agree with the group's number of permits; the others are listed as
    // mismatched and never hold.
    let eligible: Vec<(&str, &MemberMetadata)> = members
        .iter()
        .zip(&decoded)
        .filter_map(|((id, _, _), d)| d.as_ref().ok().map(|md| (id.as_str(), md)))
        .collect();
    let mismatched: Vec<(String, u16)> = eligible
        .iter()
        .filter(|(_, md)| md.permits != plan.permits)
        .map(|(id, md)| ((*id).to_owned(), md.permits))
        .collect();
    let mut plan_mismatched = plan.mismatched.clone();
    plan_mismatched.sort();
    let mut want_mismatched = mismatched.clone();
    want_mismatched.sort();
    assert_eq!(plan_mismatched, want_mismatched);
    let agreeing: Vec<(&str, &MemberMetadata)> = eligible
        .iter()
        .copied()
        .filter(|(_, md)| md.permits == plan.permits)
        .collect();
    assert_eq!(agreeing.is_empty(), eligible.is_empty());
    assert!(plan.holders.len() <= usize::from(plan.permits));
    assert!(plan.holders.windows(2).all(|w| w[0].0 < w[1].0));
    assert!(plan.holders.iter().all(|(slot, id)| *slot < plan.permits
        && agreeing.iter().any(|(a, _)| a == id)));
    assert_eq!(plan.holder.as_ref(), plan.holders.first().map(|h| &h.1));

    if plan.permits == 1 {
        let holder = agreeing
            .iter()
            .find(|(id, _)| Some(*id) == plan.holder.as_deref());
        assert_eq!(
            holder.is_some(),
            !agreeing.is_empty(),
            "holder {:?}",
            plan.holder
        );
        if let Some(&(hid, hmd)) = holder {
            let claims = agreeing.iter().filter(|(_, md)| md.holds);
            match claims.map(|(_, md)| md.holder_generation).max() {
                // Sticky: the most recent claim wins, ties by FIFO order.
                Some(newest) => {
                    assert!(hmd.holds && hmd.holder_generation == newest);
                    assert!(agreeing
                        .iter()
                        .filter(|(_, md)| md.holds && md.holder_generation == newest)
                        .all(|(id, md)| fifo(hid, hmd) <= fifo(id, md)));
                }
                None => assert!(agreeing
                    .iter()
                    .all(|(id, md)| fifo(hid, hmd) <= fifo(id, md))),
            }
        }
    }

    let holds = |id: &str| plan.holders.iter().any(|(_, h)| h == id);
    let mut waiters = Vec::new();
    for (((id, _, _), (aid, bytes)), d) in members.iter().zip(&plan.assignments).zip(&decoded) {
        assert_eq!(id, aid);
        let a = NativeAssignment::decode(bytes).expect("the assignor's own encoding decodes");
        assert_eq!(a.members as usize, members.len());
        assert_eq!(a.permits, plan.permits);
        let named: Vec<(u16, &str)> = a.holders().map(|h| (h.slot, h.member_id.as_str())).collect();
        let planned: Vec<(u16, &str)> = plan.holders.iter().map(|(s, h)| (*s, h.as_str())).collect();
        assert_eq!(named, planned);
        for h in a.holders() {
            let (_, hmd) = agreeing
                .iter()
                .find(|(id, _)| *id == h.member_id)
                .expect("a holder agrees");
            assert_eq!((h.generation, &h.label), (generation, &hmd.label));
        }
        match d {
            Err(_) => assert_eq!(a.position, -1),
            Ok(md) if md.permits != plan.permits => assert_eq!(a.position, -1),
            Ok(_) if holds(id) => assert_eq!(a.position, 0),
            Ok(md) => waiters.push((fifo(id, md), a.position)),
        }
    }
    waiters.sort();
    for (rank, (_, position)) in waiters.iter().enumerate() {
        assert_eq!(
            *position as usize,
            rank + 1,
            "waiters are numbered in FIFO order"
        );
    }

    // The plan depends on the member set, not on the order the broker listed it in.
    let reversed: Vec<Member> = members.iter().rev().cloned().collect();
    let again = assign_native(generation, &reversed);
    assert_eq!(again.holders, plan.holders);
    assert_eq!(by_id(&again.assignments), by_id(&plan.assignments));
}

fn check_consumer(members: &[Member]) {
    let range = assign_consumer(ConsumerStrategy::Range, "t", members);
    let round_robin = assign_consumer(ConsumerStrategy::RoundRobin, "t", members);
    assert_eq!(range, round_robin, "on one partition both assignors agree");
    assert_eq!(range.assignments.len(), members.len());

    let subscribed: Vec<Option<Vec<String>>> = members
        .iter()
        .map(|(_, _, m)| decode_consumer_subscription(m).ok())
        .collect();
    assert_eq!(
        range.rejected.len(),
        subscribed.iter().filter(|s| s.is_none()).count()
    );
    let wants = |s: &Option<Vec<String>>| s.as_ref().is_some_and(|t| t.iter().any(|t| t == "t"));
    assert_eq!(range.holder.is_some(), subscribed.iter().any(wants));
    for (((id, _, _), (aid, bytes)), s) in members.iter().zip(&range.assignments).zip(&subscribed) {
        assert_eq!(id, aid);
        let got = decode_consumer_assignment(bytes).expect("the assignor's own encoding decodes");
        if Some(id.as_str()) == range.holder.as_deref() {
            assert!(wants(s), "the holder is subscribed to the topic");
            assert_eq!(got, vec![("t".to_owned(), vec![0])]);
        } else {
            assert!(got.is_empty());
        }
    }

    let reversed: Vec<Member> = members.iter().rev().cloned().collect();
    let again = assign_consumer(ConsumerStrategy::Range, "t", &reversed);
    assert_eq!(again.holder, range.holder);
    assert_eq!(by_id(&again.assignments), by_id(&range.assignments));
}

fn by_id(assignments: &[(String, Bytes)]) -> HashMap<&str, &Bytes> {
    assignments.iter().map(|(id, b)| (id.as_str(), b)).collect()
}

/// The client nonce `sasl_scram` runs the SCRAM client with.
pub const SCRAM_NONCE: &str = "fyko+d2lbbFgONRv9qkxdawL";

/// Input: one control byte, then a server's SASL message.
///
/// The bytes are parsed as a SCRAM server-first-message and as a server-final-message. What
/// parses must keep the promises of `wire::sasl`: the iteration count within bounds, a
/// non-empty printable nonce and salt. With the control byte's top bit set (and the message a
/// valid server-first that extends [`SCRAM_NONCE`]) the client machine runs the whole exchange
/// (PBKDF2 included, so those inputs are slow) with the control byte's bit 0 choosing SHA-256 or
/// SHA-512, and the same bytes as server-final must never verify: no input can forge the
/// server's signature.
pub fn sasl_scram(data: &[u8]) {
    let Some((&control, msg)) = data.split_first() else {
        return;
    };
    match parse_server_first(msg) {
        Ok(first) => {
            assert!((MIN_ITERATIONS..=MAX_ITERATIONS).contains(&first.iterations));
            assert!(!first.nonce.is_empty() && !first.nonce.contains(','));
            assert!(!first.salt.is_empty());
        }
        Err(ScramError::Iterations(n)) => {
            assert!(n < u64::from(MIN_ITERATIONS) || n > u64::from(MAX_ITERATIONS))
        }
        Err(_) => {}
    }
    let _ = parse_server_final(msg);
    if control & 0x80 == 0 {
        return;
    }
    let hash = if control & 1 == 0 {
        ScramHash::Sha256
    } else {
        ScramHash::Sha512
    };
    let mut client = ScramClient::new(hash, "user", "pencil", SCRAM_NONCE.to_owned());
    let first = client.client_first();
    assert!(first.starts_with(b"n,,n=user,r="));
    // Out of order: a final message before the first is refused.
    assert!(client.server_final(msg).is_err());
    match client.server_first(msg) {
        Ok(final_msg) => {
            assert!(final_msg.starts_with(b"c=biws,r="));
            assert!(client.server_final(msg).is_err(), "a forged server signature verified");
        }
        Err(_) => assert!(client.server_final(msg).is_err()),
    }
}

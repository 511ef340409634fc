//! What the decoding guard costs: JoinGroup, SyncGroup and Heartbeat responses decoded through
//! `kafka_lock::wire` versus kafka-protocol's own `Decodable::decode` on the same bytes.
//!
//! Run with `cargo bench --bench decode`; results are recorded in BENCHMARKS.md.

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use criterion::Criterion;
use kafka_lock::internals::wire::codec::{decode_response, decode_response_bytes, Response};
use kafka_lock::internals::wire::guard::scan_response;
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{ApiKey, HeartbeatResponse, JoinGroupResponse, SyncGroupResponse};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};

/// A member id as brokers generate them: client id, a dash, a UUID.
fn member_id(i: usize) -> StrBytes {
    StrBytes::from_string(format!("kafka-lock-{i}-5f0c3a4e-9b1d-4c7e-8a2f-{i:012}"))
}

/// What the group leader receives: five members, each with ~50 bytes of protocol metadata.
fn join_group_leader() -> JoinGroupResponse {
    let members = (0..5)
        .map(|i| {
            JoinGroupResponseMember::default()
                .with_member_id(member_id(i))
                .with_metadata(Bytes::from(vec![i as u8; 50]))
        })
        .collect();
    JoinGroupResponse::default()
        .with_generation_id(42)
        .with_protocol_type(Some(StrBytes::from_static_str("kafka-lock")))
        .with_protocol_name(Some(StrBytes::from_static_str("lock-v1")))
        .with_leader(member_id(0))
        .with_member_id(member_id(0))
        .with_members(members)
}

fn sync_group() -> SyncGroupResponse {
    SyncGroupResponse::default()
        .with_protocol_type(Some(StrBytes::from_static_str("kafka-lock")))
        .with_protocol_name(Some(StrBytes::from_static_str("lock-v1")))
        .with_assignment(Bytes::from(vec![7u8; 32]))
}

fn encode<T: Encodable>(value: &T, version: i16) -> Bytes {
    let mut out = BytesMut::new();
    value
        .encode(&mut out, version)
        .expect("benchmark value encodes");
    out.freeze()
}

fn bench_one<T: Decodable>(c: &mut Criterion, name: &str, api: ApiKey, version: i16, body: Bytes) {
    let mut group = c.benchmark_group(format!("{name}_v{version}_{}B", body.len()));
    group.bench_function("kafka_protocol_slice", |b| {
        b.iter(|| {
            let mut buf: &[u8] = black_box(&body[..]);
            T::decode(&mut buf, version).expect("decodes")
        })
    });
    group.bench_function("kafka_lock_slice", |b| {
        b.iter(|| decode_response(api, version, black_box(&body[..])).expect("decodes"))
    });
    group.bench_function("kafka_protocol_bytes", |b| {
        b.iter(|| {
            let mut buf = black_box(&body).clone();
            T::decode(&mut buf, version).expect("decodes")
        })
    });
    group.bench_function("kafka_lock_bytes", |b| {
        b.iter(|| decode_response_bytes(api, version, black_box(&body).clone()).expect("decodes"))
    });
    group.bench_function("guard_scan_only", |b| {
        b.iter(|| scan_response(api, version, black_box(&body[..])).expect("scans"))
    });
    group.finish();
}

/// The benchmark cases: (name, API, version, body, raw kafka-protocol decode of a slice).
type RawDecode = fn(&[u8], i16);

fn raw<T: Decodable>(body: &[u8], version: i16) {
    let mut buf = body;
    black_box(T::decode(&mut buf, version).expect("decodes"));
}

/// kafka-protocol's decode, wrapped in our `Response` enum but unguarded: separates what the
/// enum costs (moving a 192-byte value instead of the bare struct) from what the guard costs.
fn raw_enum<T: Decodable + Into<Response>>(body: &[u8], version: i16) {
    let mut buf = body;
    let response: Response = T::decode(&mut buf, version).expect("decodes").into();
    black_box(response);
}

fn cases() -> Vec<(&'static str, ApiKey, i16, Bytes, RawDecode, RawDecode)> {
    let join = join_group_leader();
    vec![
        (
            "join_group_leader",
            ApiKey::JoinGroup,
            9,
            encode(&join, 9),
            raw::<JoinGroupResponse>,
            raw_enum::<JoinGroupResponse>,
        ),
        (
            "join_group_leader",
            ApiKey::JoinGroup,
            5,
            encode(&join.clone().with_protocol_type(None), 5),
            raw::<JoinGroupResponse>,
            raw_enum::<JoinGroupResponse>,
        ),
        (
            "sync_group",
            ApiKey::SyncGroup,
            5,
            encode(&sync_group(), 5),
            raw::<SyncGroupResponse>,
            raw_enum::<SyncGroupResponse>,
        ),
        (
            "heartbeat",
            ApiKey::Heartbeat,
            4,
            encode(&HeartbeatResponse::default(), 4),
            raw::<HeartbeatResponse>,
            raw_enum::<HeartbeatResponse>,
        ),
    ]
}

fn decode(c: &mut Criterion) {
    let join = join_group_leader();
    bench_one::<JoinGroupResponse>(
        c,
        "join_group_leader",
        ApiKey::JoinGroup,
        9,
        encode(&join, 9),
    );
    bench_one::<JoinGroupResponse>(
        c,
        "join_group_leader",
        ApiKey::JoinGroup,
        5,
        encode(&join.clone().with_protocol_type(None), 5),
    );
    bench_one::<SyncGroupResponse>(
        c,
        "sync_group",
        ApiKey::SyncGroup,
        5,
        encode(&sync_group(), 5),
    );
    bench_one::<HeartbeatResponse>(
        c,
        "heartbeat",
        ApiKey::Heartbeat,
        4,
        encode(&HeartbeatResponse::default(), 4),
    );
}

/// Time per call of `f`, measured over `iters` calls.
fn time_batch(iters: u32, f: &mut dyn FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..iters {
        f();
    }
    start.elapsed().as_secs_f64() / f64::from(iters)
}

/// Interleaved A/B measurement: on a shared machine, criterion's back-to-back runs of A and B can
/// land in different load conditions. Here every round times a batch of A and a batch of B right
/// after each other (alternating which goes first) and keeps their ratio; the median ratio over
/// many rounds is what BENCHMARKS.md reports as the overhead.
fn paired_overhead() {
    println!(
        "\nInterleaved medians (ns per decode), kafka_lock::wire::decode_response vs kafka-protocol Decodable::decode, both from &[u8]:"
    );
    println!(
        "{:<26} {:>8} {:>9} {:>8} {:>8} {:>26} {:>10}",
        "case", "raw", "raw+enum", "ours", "scan", "ours vs raw (p25..p75)", "vs r+enum"
    );
    for (name, api, version, body, raw_decode, raw_enum_decode) in cases() {
        let mut a = || raw_decode(black_box(&body[..]), version);
        let mut e = || raw_enum_decode(black_box(&body[..]), version);
        let mut b = || {
            black_box(decode_response(api, version, black_box(&body[..])).expect("decodes"));
        };
        let mut scan = || {
            black_box(scan_response(api, version, black_box(&body[..])).expect("scans"));
        };
        // Batches of roughly 100 µs.
        let per_call = time_batch(10_000, &mut a).max(1e-9);
        let iters = ((100e-6 / per_call) as u32).max(10);
        let (mut ratios, mut enum_ratios) = (Vec::new(), Vec::new());
        let (mut raw_t, mut enum_t, mut ours_t, mut scan_t) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..400 {
            let (ta, tb) = if round % 2 == 0 {
                let ta = time_batch(iters, &mut a);
                (ta, time_batch(iters, &mut b))
            } else {
                let tb = time_batch(iters, &mut b);
                (time_batch(iters, &mut a), tb)
            };
            let te = time_batch(iters, &mut e);
            scan_t.push(time_batch(iters, &mut scan));
            ratios.push(tb / ta);
            enum_ratios.push(tb / te);
            raw_t.push(ta);
            enum_t.push(te);
            ours_t.push(tb);
        }
        let quantile = |v: &mut Vec<f64>, q: f64| {
            v.sort_by(|x, y| x.total_cmp(y));
            v[((v.len() - 1) as f64 * q) as usize]
        };
        let (r25, r50, r75) = (
            quantile(&mut ratios, 0.25),
            quantile(&mut ratios, 0.5),
            quantile(&mut ratios, 0.75),
        );
        println!(
            "{:<26} {:>8.1} {:>9.1} {:>8.1} {:>8.1} {:>+8.1}% ({:>+6.1}%..{:>+6.1}%) {:>+9.1}%",
            format!("{name}_v{version}_{}B", body.len()),
            quantile(&mut raw_t, 0.5) * 1e9,
            quantile(&mut enum_t, 0.5) * 1e9,
            quantile(&mut ours_t, 0.5) * 1e9,
            quantile(&mut scan_t, 0.5) * 1e9,
            (r50 - 1.0) * 100.0,
            (r25 - 1.0) * 100.0,
            (r75 - 1.0) * 100.0,
            (quantile(&mut enum_ratios, 0.5) - 1.0) * 100.0,
        );
    }
}

fn main() {
    // Short runs: the machine is shared; the per-iteration times are sub-microsecond, so these
    // still collect millions of iterations per case.
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50)
        .configure_from_args();
    decode(&mut c);
    c.final_summary();
    // `cargo bench` passes --bench; `cargo test --benches` does not and only smoke-tests.
    if std::env::args().any(|a| a == "--bench") {
        paired_overhead();
    }
}

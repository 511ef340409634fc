//! What the decoding guard costs: JoinGroup, SyncGroup and Heartbeat responses decoded through
//! `kafka_lock::wire` versus kafka-protocol's own `Decodable::decode` on the same bytes.
//!
//! Run with `cargo bench --bench decode`; results are recorded in BENCHMARKS.md.

use std::hint::black_box;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion};
use kafka_lock::wire::codec::{decode_response, decode_response_bytes};
use kafka_lock::wire::guard::scan_response;
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

criterion_group! {
    name = benches;
    // Short runs: the machine is shared; the per-iteration times are sub-microsecond, so these
    // still collect millions of iterations per case.
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(50);
    targets = decode
}
criterion_main!(benches);

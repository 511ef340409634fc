use super::program::{min_struct_size, programs, Op};
use super::tables::{message_index, StructSchema, Ty, MESSAGES};
use super::*;
use bytes::Buf;
use kafka_protocol::messages::{
    ApiVersionsResponse, DescribeConfigsResponse, DescribeGroupsResponse, FetchResponse,
    FindCoordinatorResponse, HeartbeatResponse, JoinGroupResponse, LeaveGroupResponse,
    ListOffsetsResponse, MetadataResponse, OffsetCommitResponse, OffsetFetchResponse,
    ProduceResponse, SaslAuthenticateResponse, SaslHandshakeResponse, SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, Message};
use proptest::prelude::*;
use Ty::*;

/// A tiny deterministic generator so the schema test needs no extra dependency.
pub(crate) struct Rng(pub(crate) u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn put_uvarint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

struct Gen<'r> {
    rng: &'r mut Rng,
    version: i16,
    flexible: bool,
    /// Maximum array length; shrinks with depth so bodies stay small.
    fanout: u64,
}

impl Gen<'_> {
    fn length(&mut self, out: &mut Vec<u8>, n: usize, classic_width: usize) {
        if self.flexible {
            put_uvarint(out, n as u32 + 1);
        } else if classic_width == 2 {
            out.extend_from_slice(&(n as i16).to_be_bytes());
        } else {
            out.extend_from_slice(&(n as i32).to_be_bytes());
        }
    }

    fn ty(&mut self, out: &mut Vec<u8>, ty: Ty, non_default: bool) {
        match ty {
            Bool => out.push(if non_default {
                1
            } else {
                self.rng.below(2) as u8
            }),
            Int8 => out.push(self.rng.next() as u8),
            Int16 => out.extend_from_slice(&(self.rng.next() as i16).to_be_bytes()),
            Int32 => out.extend_from_slice(&(self.rng.next() as i32).to_be_bytes()),
            Int64 => {
                let mut v = self.rng.next() as i64;
                if v == -1 {
                    v = 7;
                }
                out.extend_from_slice(&v.to_be_bytes())
            }
            Uuid => {
                for _ in 0..16 {
                    out.push(self.rng.next() as u8);
                }
            }
            Str => {
                let n = self.rng.below(12) as usize;
                self.length(out, n, 2);
                for _ in 0..n {
                    out.push(b'a' + self.rng.below(26) as u8);
                }
            }
            Blob => {
                let n = self.rng.below(40) as usize;
                self.length(out, n, 4);
                for _ in 0..n {
                    out.push(self.rng.next() as u8);
                }
            }
            StrArray => {
                let n = self.rng.below(5) as usize;
                self.length(out, n, 4);
                for _ in 0..n {
                    self.ty(out, Str, false);
                }
            }
            Int32Array => {
                let n = self.rng.below(5) as usize;
                self.length(out, n, 4);
                for _ in 0..n {
                    out.extend_from_slice(&(self.rng.next() as i32).to_be_bytes());
                }
            }
            // A tagged struct is only written when it differs from its default, which random
            // fields and unknown tags make all but certain.
            Struct(s) => self.structure(out, s),
            Array(s) => {
                let n = self.rng.below(self.fanout + 1) as usize;
                let n = if non_default { n.max(1) } else { n };
                self.length(out, n, 4);
                let saved = self.fanout;
                self.fanout = (self.fanout / 2).max(1);
                for _ in 0..n {
                    self.structure(out, s);
                }
                self.fanout = saved;
            }
        }
    }

    fn structure(&mut self, out: &mut Vec<u8>, s: &StructSchema) {
        let version = self.version;
        for field in s.fields.iter().filter(|f| f.present(version)) {
            self.ty(out, field.ty, false);
        }
        if !self.flexible {
            return;
        }
        // Known tags with values kafka-protocol re-encodes (non-default), unknown tags with
        // numbers above every known one, all ascending as its encoder writes them.
        let mut fields: Vec<(u32, Vec<u8>)> = Vec::new();
        for k in s.tagged.iter().filter(|k| k.present(version)) {
            if self.rng.below(2) == 0 {
                let mut v = Vec::new();
                self.ty(&mut v, k.ty, true);
                fields.push((k.tag, v));
            }
        }
        let mut next_unknown = s.tagged.iter().map(|k| k.tag + 1).max().unwrap_or(0);
        for _ in 0..self.rng.below(3) {
            next_unknown += 1 + self.rng.below(3) as u32;
            let v = (0..self.rng.below(6))
                .map(|_| self.rng.next() as u8)
                .collect();
            fields.push((next_unknown, v));
        }
        put_uvarint(out, fields.len() as u32);
        for (tag, v) in fields {
            put_uvarint(out, tag);
            put_uvarint(out, v.len() as u32);
            out.extend_from_slice(&v);
        }
    }
}

/// A random body, valid by the guard's tables, for `api` at `version`.
pub(crate) fn generate(api: ApiKey, version: i16, seed: u64) -> Vec<u8> {
    let m = schema(api).expect("covered api");
    let mut rng = Rng(seed);
    let mut g = Gen {
        rng: &mut rng,
        version,
        flexible: version >= m.flexible,
        fanout: 4,
    };
    let mut out = Vec::new();
    g.structure(&mut out, m.root);
    out
}

/// `$f::<T>(args)` with `T` kafka-protocol's response type for `$api`: the one list of the
/// types the tables are checked against.
macro_rules! by_response_type {
    ($api:expr, $f:ident($($arg:expr),*)) => {
        match $api {
            ApiKey::ApiVersions => $f::<ApiVersionsResponse>($($arg),*),
            ApiKey::Metadata => $f::<MetadataResponse>($($arg),*),
            ApiKey::FindCoordinator => $f::<FindCoordinatorResponse>($($arg),*),
            ApiKey::JoinGroup => $f::<JoinGroupResponse>($($arg),*),
            ApiKey::SyncGroup => $f::<SyncGroupResponse>($($arg),*),
            ApiKey::Heartbeat => $f::<HeartbeatResponse>($($arg),*),
            ApiKey::LeaveGroup => $f::<LeaveGroupResponse>($($arg),*),
            ApiKey::DescribeGroups => $f::<DescribeGroupsResponse>($($arg),*),
            ApiKey::OffsetCommit => $f::<OffsetCommitResponse>($($arg),*),
            ApiKey::OffsetFetch => $f::<OffsetFetchResponse>($($arg),*),
            ApiKey::Produce => $f::<ProduceResponse>($($arg),*),
            ApiKey::Fetch => $f::<FetchResponse>($($arg),*),
            ApiKey::ListOffsets => $f::<ListOffsetsResponse>($($arg),*),
            ApiKey::DescribeConfigs => $f::<DescribeConfigsResponse>($($arg),*),
            ApiKey::SaslHandshake => $f::<SaslHandshakeResponse>($($arg),*),
            ApiKey::SaslAuthenticate => $f::<SaslAuthenticateResponse>($($arg),*),
            other => panic!("{other:?} has no table"),
        }
    };
}

/// Decodes with kafka-protocol, requires every byte consumed, re-encodes and returns the bytes.
fn kp_round_trip(api: ApiKey, version: i16, body: &[u8]) -> Result<Vec<u8>, std::string::String> {
    fn rt<T: Decodable + Encodable>(
        body: &[u8],
        version: i16,
    ) -> Result<Vec<u8>, std::string::String> {
        let mut buf = bytes::Bytes::copy_from_slice(body);
        let value = T::decode(&mut buf, version).map_err(|e| format!("decode: {e:#}"))?;
        if buf.has_remaining() {
            return Err(format!("kafka-protocol left {} bytes", buf.remaining()));
        }
        let mut out = bytes::BytesMut::new();
        value
            .encode(&mut out, version)
            .map_err(|e| format!("encode: {e:#}"))?;
        Ok(out.to_vec())
    }
    by_response_type!(api, rt(body, version))
}

pub(crate) fn all_covered() -> impl Iterator<Item = (ApiKey, i16)> {
    MESSAGES
        .iter()
        .flat_map(|m| (m.min..=m.max).map(move |v| (m.api, v)))
}

#[test]
fn version_ranges_are_kafka_protocols() {
    fn range<T: Message>() -> (i16, i16) {
        (T::VERSIONS.min, T::VERSIONS.max)
    }
    let expected = MESSAGES
        .iter()
        .map(|m| (m.api, by_response_type!(m.api, range())));
    for (api, range) in expected {
        assert_eq!(covered_versions(api), Some(range), "{api:?}");
        let m = schema(api).unwrap();
        // The first flexible version is where the response header becomes v1 (except for
        // ApiVersions, whose response header is always v0).
        if api != ApiKey::ApiVersions {
            for v in m.min..=m.max {
                assert_eq!(
                    api.response_header_version(v),
                    i16::from(v >= m.flexible),
                    "{api:?} v{v}"
                );
            }
        }
    }
}

/// The central proof: bodies generated from our tables are exactly what kafka-protocol reads
/// and writes, for every covered (API, version), in many shapes.
#[test]
fn tables_match_kafka_protocol_for_every_version() {
    for (api, version) in all_covered() {
        for seed in 0..200u64 {
            let body = generate(
                api,
                version,
                seed ^ ((api as u64) << 32) ^ ((version as u64) << 48),
            );
            let scan = scan_response(api, version, &body)
                .unwrap_or_else(|e| panic!("{api:?} v{version} seed {seed}: scan rejected: {e}"));
            assert_eq!(scan.consumed, body.len());
            let again = kp_round_trip(api, version, &body)
                .unwrap_or_else(|e| panic!("{api:?} v{version} seed {seed}: {e}\n{body:?}"));
            assert_eq!(
                again, body,
                "{api:?} v{version} seed {seed}: re-encoding differs"
            );
        }
    }
}

#[test]
fn default_values_encoded_by_kafka_protocol_scan_exactly() {
    fn enc<T: Default + Encodable>(version: i16) -> Vec<u8> {
        let mut out = bytes::BytesMut::new();
        T::default().encode(&mut out, version).unwrap();
        out.to_vec()
    }
    for (api, v) in all_covered() {
        let body = by_response_type!(api, enc(v));
        assert_eq!(
            scan_response(api, v, &body).unwrap().consumed,
            body.len(),
            "{api:?} v{v}"
        );
    }
}

/// The amplification budget never rejects a body without unknown tagged fields: every struct,
/// at every version it occurs in, costs at most half the budget per byte.
#[test]
fn amplification_of_every_struct_is_within_half_the_budget() {
    /// Records every array element struct reachable from `s`; embedded structs are part of
    /// their parent's allocation and cost nothing themselves.
    fn visit(
        s: &'static StructSchema,
        v: i16,
        flexible: bool,
        worst: &mut Vec<(&'static str, i16, usize)>,
    ) {
        let fields = s.fields.iter().filter(|f| f.present(v)).map(|f| f.ty);
        let tags = s
            .tagged
            .iter()
            .filter(|t| flexible && t.present(v))
            .map(|t| t.ty);
        for ty in fields.chain(tags) {
            match ty {
                Array(e) => {
                    let min = min_struct_size(e, v, flexible).max(1);
                    worst.push((e.name, v, e.mem.div_ceil(min)));
                    visit(e, v, flexible, worst);
                }
                Struct(e) => visit(e, v, flexible, worst),
                _ => {}
            }
        }
    }
    let mut worst = Vec::new();
    for m in &MESSAGES {
        for v in m.min..=m.max {
            visit(m.root, v, v >= m.flexible, &mut worst);
        }
    }
    worst.sort_by_key(|w| std::cmp::Reverse(w.2));
    // A non-empty string or byte field costs its length plus the overhead, and occupies at
    // least its length plus one byte of prefix: at worst (1 + overhead) per 2 input bytes.
    assert!((ALLOCATION_OVERHEAD + 1).div_ceil(2) <= MAX_AMPLIFICATION / 2);
    eprintln!(
        "worst structs (name, version, heap bytes per input byte): {:?}",
        &worst[..6]
    );
    assert!(
        worst[0].2 <= MAX_AMPLIFICATION / 2,
        "worst structs: {:?}",
        &worst[..5]
    );
}

#[test]
fn compiled_programs_merge_fixed_fields_only_within_a_struct() {
    let heartbeat = &programs()[message_index(ApiKey::Heartbeat).unwrap()][4];
    assert_eq!(
        heartbeat.ops,
        [
            Op::Skip(6),
            Op::Tags {
                known: NO_KNOWN_TAGS
            }
        ]
    );
    assert_eq!(heartbeat.fixed, Some((6, true)));
    let skipped: Vec<_> = all_covered()
        .filter(|&(api, v)| needs_scan(api, v) == Some(false))
        .collect();
    let mut expected: Vec<_> = (0..=4).map(|v| (ApiKey::Heartbeat, v)).collect();
    expected.extend((0..=5).map(|v| (ApiKey::SyncGroup, v)));
    expected.extend((0..=2).map(|v| (ApiKey::LeaveGroup, v)));
    expected.extend((0..=3).map(|v| (ApiKey::FindCoordinator, v)));
    expected.extend((0..=2).map(|v| (ApiKey::SaslAuthenticate, v)));
    expected.sort_by_key(|&(a, v)| (a as i16, v));
    let mut skipped = skipped;
    skipped.sort_by_key(|&(a, v)| (a as i16, v));
    assert_eq!(skipped, expected);
    assert_eq!(
        programs()[message_index(ApiKey::Heartbeat).unwrap()][0].fixed,
        Some((2, false))
    );
    assert_eq!(
        programs()[message_index(ApiKey::SyncGroup).unwrap()][0].fixed,
        None
    );
    // ApiVersions v1: error code, the api_keys array (each element three int16), throttle.
    let api_versions = &programs()[message_index(ApiKey::ApiVersions).unwrap()][1];
    assert!(
        matches!(
            api_versions.ops[..],
            [
                Op::Skip(2),
                Op::Array {
                    compact: false,
                    min: 6,
                    len: 1,
                    ..
                },
                Op::Skip(6),
                Op::Skip(4)
            ]
        ),
        "{:?}",
        api_versions.ops
    );
    assert_eq!(api_versions.ops.len(), api_versions.labels.len());
    let join = &programs()[message_index(ApiKey::JoinGroup).unwrap()];
    assert!(
        matches!(
            join[9].ops[..],
            [
                Op::Skip(10),
                Op::Compacts(3),
                Op::Skip(1),
                Op::Compacts(1),
                Op::Array { len: 2, .. },
                Op::Compacts(3),
                Op::Tags { .. },
                Op::Tags { .. }
            ]
        ),
        "{:?}",
        join[9].ops
    );
    assert!(
        matches!(
            join[5].ops[..],
            [
                Op::Skip(10),
                Op::Classic { n: 3, wide: 0 },
                Op::Array { len: 1, .. },
                Op::Classic { n: 3, wide: 0b100 }
            ]
        ),
        "{:?}",
        join[5].ops
    );
    assert_eq!(
        join[5].labels[3],
        (
            "JoinGroupResponseMember",
            "member_id or group_instance_id or metadata"
        )
    );
    for (i, m) in MESSAGES.iter().enumerate() {
        assert_eq!(message_index(m.api), Some(i));
    }
}

#[test]
fn huge_counts_in_a_few_bytes_are_rejected_before_any_allocation() {
    // JoinGroup v5: throttle, error, generation, 3 empty strings, then 2^31-1 members.
    let mut body = vec![0u8; 4 + 2 + 4];
    body.extend_from_slice(&[0, 0, 0, 0, 0, 0]);
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    let err = scan_response(ApiKey::JoinGroup, 5, &body).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::ArrayTooLong {
                    count: 0x7fff_ffff,
                    ..
                },
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("JoinGroupResponse.members"),
        "{err}"
    );

    // Flexible (v9): compact count 2^32-2 via a maximal varint.
    let mut body = vec![0u8; 4 + 2 + 4];
    body.extend_from_slice(&[1, 1, 1, 0, 1]); // protocol_type, protocol_name, leader, skip, member_id
    body.extend_from_slice(&[0xff, 0xff, 0xff, 0xff, 0x0f]);
    let err = scan_response(ApiKey::JoinGroup, 9, &body).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::ArrayTooLong { .. },
                ..
            }
        ),
        "{err}"
    );

    // A nested array: Metadata v1, one broker-less, one topic whose partition claims 10^9
    // replica ids.
    let mut body = Vec::new();
    body.extend_from_slice(&0i32.to_be_bytes()); // brokers
    body.extend_from_slice(&0i32.to_be_bytes()); // controller
    body.extend_from_slice(&1i32.to_be_bytes()); // topics
    body.extend_from_slice(&[0, 0, 0, 0, 0]); // error, name "", internal
    body.extend_from_slice(&1i32.to_be_bytes()); // partitions
    body.extend_from_slice(&[0; 10]);
    body.extend_from_slice(&1_000_000_000i32.to_be_bytes());
    body.extend_from_slice(&0i32.to_be_bytes()); // isr_nodes
    let err = scan_response(ApiKey::Metadata, 1, &body).unwrap_err();
    assert!(err.to_string().contains("replica_nodes"), "{err}");

    // A byte field claiming 2 GiB.
    let mut body = vec![0, 0, 0, 0, 0, 0];
    body.extend_from_slice(&i32::MAX.to_be_bytes());
    let err = scan_response(ApiKey::SyncGroup, 1, &body).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::Truncated { .. },
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn negative_lengths_and_bad_varints_are_rejected() {
    // SyncGroup v0: error code, then assignment length -2.
    let body = [0, 0, 0xff, 0xff, 0xff, 0xfe];
    let err = scan_response(ApiKey::SyncGroup, 0, &body).unwrap_err();
    assert!(matches!(
        err,
        DecodeError::Malformed {
            reason: Malformation::NegativeLength { length: -2 },
            ..
        }
    ));
    // Null is a layout the scan accepts (kafka-protocol decides whether it is allowed).
    let body = [0, 0, 0xff, 0xff, 0xff, 0xff];
    assert!(scan_response(ApiKey::SyncGroup, 0, &body).is_ok());
    // Heartbeat v4: throttle, error, then a six-byte varint as the tagged-field count.
    let body = [0, 0, 0, 0, 0, 0, 0x80, 0x80, 0x80, 0x80, 0x80, 0x01];
    let err = scan_response(ApiKey::Heartbeat, 4, &body).unwrap_err();
    assert!(matches!(
        err,
        DecodeError::Malformed {
            reason: Malformation::BadVarint,
            ..
        }
    ));
}

#[test]
fn lying_known_tag_size_is_rejected() {
    // ApiVersions v3: error, empty api_keys, throttle, one tag (3 = zk_migration_ready) that
    // claims 2 bytes but holds a 1-byte bool.
    let body = [0, 0, 1, 0, 0, 0, 0, 1, 3, 2, 1, 0];
    let err = scan_response(ApiKey::ApiVersions, 3, &body).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::TaggedFieldSize {
                    tag: 3,
                    declared: 2,
                    actual: 1
                },
                ..
            }
        ),
        "{err}"
    );
    // A known array tag whose count runs past its declared size.
    let body = [0, 0, 1, 0, 0, 0, 0, 1, 0, 1, 5, 0];
    assert!(scan_response(ApiKey::ApiVersions, 3, &body).is_err());
}

#[test]
fn many_unknown_tags_hit_the_memory_budget() {
    // Heartbeat v4 with 40000 empty unknown tagged fields: 80 KB of input, charged
    // UNKNOWN_TAG_COST each (20 MB), over the 5.2 MB budget. (decode_response does not scan
    // Heartbeat at all; there the BTreeMap's ~100 bytes per entry stay within the bound.)
    let n = 40_000u32;
    let mut body = vec![0, 0, 0, 0, 0, 0];
    put_uvarint(&mut body, n);
    for tag in 0..n {
        put_uvarint(&mut body, tag);
        body.push(0);
    }
    let err = scan_response(ApiKey::Heartbeat, 4, &body).unwrap_err();
    assert!(
        matches!(
            err,
            DecodeError::Malformed {
                reason: Malformation::MemoryBudget { .. },
                ..
            }
        ),
        "{err}"
    );
    // A handful is fine.
    let body = [0, 0, 0, 0, 0, 0, 2, 7, 1, 9, 8, 0];
    assert!(scan_response(ApiKey::Heartbeat, 4, &body).is_ok());
}

#[test]
fn every_truncation_of_valid_bodies_is_a_typed_error() {
    for (api, version) in all_covered() {
        for seed in 0..8u64 {
            let body = generate(api, version, seed.wrapping_mul(7919) + version as u64);
            for cut in 0..body.len() {
                match scan_response(api, version, &body[..cut]) {
                    Err(DecodeError::Malformed { .. }) => {}
                    other => panic!("{api:?} v{version} cut {cut}/{}: {other:?}", body.len()),
                }
            }
            let mut longer = body.clone();
            longer.extend_from_slice(&[1, 2, 3]);
            assert!(matches!(
                scan_response(api, version, &longer),
                Err(DecodeError::TrailingBytes { left: 3, .. })
            ));
        }
    }
}

#[test]
fn unsupported_versions_are_typed_errors() {
    for (api, v) in [
        (ApiKey::JoinGroup, 10),
        (ApiKey::OffsetCommit, 1),
        (ApiKey::Produce, 0),
        (ApiKey::Heartbeat, -1),
    ] {
        assert!(matches!(
            scan_response(api, v, &[0; 16]),
            Err(DecodeError::UnsupportedVersion { .. })
        ));
    }
}

#[test]
fn header_scan() {
    assert_eq!(scan_response_header(&[0, 0, 0, 7, 9], 0), Ok((7, 4)));
    assert_eq!(
        scan_response_header(&[0, 0, 0, 7, 1, 5, 2, 0, 0, 9], 1),
        Ok((7, 9))
    );
    assert!(scan_response_header(&[0, 0, 0], 0).is_err());
    assert!(scan_response_header(&[0, 0, 0, 7, 1, 5, 9], 1).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(
        which in 0usize..MESSAGES.len(),
        version in -1i16..15,
        body in proptest::collection::vec(any::<u8>(), 0..256),
    ) {
        let api = MESSAGES[which].api;
        if let Ok(scan) = scan_response(api, version, &body) {
            prop_assert_eq!(scan.consumed, body.len());
        }
    }

    #[test]
    fn mutated_valid_bodies_never_panic(
        which in 0usize..MESSAGES.len(),
        seed in any::<u64>(),
        flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..4),
    ) {
        let m = &MESSAGES[which];
        let version = m.min + (seed % (m.max - m.min + 1) as u64) as i16;
        let mut body = generate(m.api, version, seed);
        if body.is_empty() { return Ok(()); }
        for (at, byte) in flips {
            let i = at % body.len();
            body[i] = byte;
        }
        if let Ok(scan) = scan_response(m.api, version, &body) {
            prop_assert_eq!(scan.consumed, body.len());
            prop_assert!(scan.heap_estimate <= body.len() * MAX_AMPLIFICATION + AMPLIFICATION_SLACK);
        }
    }
}

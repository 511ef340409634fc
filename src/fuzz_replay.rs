//! Replays every committed fuzz input on stable Rust, without libFuzzer.
//!
//! `fuzz/corpus/<target>/` holds the minimised corpora and `fuzz/regressions/<target>/` every input
//! that ever crashed, ran out of memory or timed out (plus hand-written inputs for hazards known
//! in advance). Each file goes through the same function the fuzz target calls, from
//! `fuzz/targets.rs`, so a fixed bug stays fixed in plain `cargo test`. See `docs/fuzzing.md`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

mod targets {
    // The shared file names the library `kafka_lock`, as the fuzz crate sees it.
    use crate as kafka_lock;
    include!("../fuzz/targets.rs");
}

/// A bound on pathological work (a parse gone quadratic), not a speed test: most inputs finish in
/// milliseconds, but a SCRAM input may ask for the largest PBKDF2 count accepted
/// (`wire::sasl::MAX_ITERATIONS`), about a second unoptimised and several on a loaded machine.
/// Hangs are the fuzzers' to find: an input that never returns never reaches this check.
const PER_INPUT: Duration = Duration::from_secs(20);

fn fuzz_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz")
}

/// The files of `fuzz/<root>/<target>/`, failing if the directory is missing or empty.
fn inputs(root: &str, target: &str) -> Vec<PathBuf> {
    let dir = fuzz_dir().join(root).join(target);
    let entries = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}; every fuzz target needs it", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|e| e.expect("readable directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    assert!(!files.is_empty(), "{} is empty", dir.display());
    files
}

/// Every subdirectory of `fuzz/<root>/` must belong to a target, so no input is silently skipped.
fn assert_no_unknown_targets(root: &str) {
    let dir = fuzz_dir().join(root);
    for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.expect("readable directory entry").path();
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        assert!(
            targets::TARGETS.iter().any(|(t, _)| *t == name),
            "{}: no fuzz target of that name",
            path.display()
        );
    }
}

fn replay(root: &str) -> usize {
    assert_no_unknown_targets(root);
    let mut count = 0;
    for &(target, run) in targets::TARGETS {
        for path in inputs(root, target) {
            let data = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let started = Instant::now();
            if let Err(panic) = std::panic::catch_unwind(|| run(&data)) {
                let msg = panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                panic!("{target}: {} failed: {msg}", path.display());
            }
            let took = started.elapsed();
            assert!(
                took < PER_INPUT,
                "{target}: {} took {took:?}",
                path.display()
            );
            count += 1;
        }
    }
    count
}

#[test]
fn corpus_replays() {
    let n = replay("corpus");
    assert!(n >= targets::TARGETS.len());
}

#[test]
fn regressions_replay() {
    let n = replay("regressions");
    assert!(n >= targets::TARGETS.len());
}

/// The response corpus keeps one input per supported (API, version), so `cargo test` decodes
/// every version even where minimisation would have merged versions that share a code path.
#[test]
fn response_corpus_covers_every_supported_version() {
    let mut seen = std::collections::HashSet::new();
    for path in inputs("corpus", "response_decode") {
        let data = std::fs::read(&path).expect("readable corpus file");
        if let [key, version, ..] = data[..] {
            seen.insert((i16::from(key), i16::from(version as i8)));
        }
    }
    let missing: Vec<String> = crate::wire::versions::SUPPORTED
        .iter()
        .flat_map(|&(api, min, max)| (min..=max).map(move |v| (api, v)))
        .filter(|&(api, v)| !seen.contains(&(api as i16, v)))
        .map(|(api, v)| format!("{api:?} v{v}"))
        .collect();
    assert!(missing.is_empty(), "no corpus input for {missing:?}");
}

/// Writes one seed per supported (API, version), a valid body from the guard's generator, next to
/// the seeds made from the captured frames of `testdata/`. Run by hand when `SUPPORTED`
/// grows: `cargo test --lib fuzz_replay::write_generated_seeds -- --ignored`.
#[test]
#[ignore = "writes files; run by hand to refresh seeds"]
fn write_generated_seeds() {
    let dir = fuzz_dir().join("corpus/response_decode");
    std::fs::create_dir_all(&dir).expect("corpus directory");
    for &(api, min, max) in crate::wire::versions::SUPPORTED {
        for version in min..=max {
            let body = crate::wire::guard::tests::generate(api, version, 7);
            let mut input = vec![api as i16 as u8, version as u8];
            input.extend_from_slice(&body);
            let name = format!("generated-{:?}-v{version}", api).to_lowercase();
            std::fs::write(dir.join(name), input).expect("seed written");
        }
    }
}

/// Writes the `record_batch_decode` seeds (`seed-*`: batches from our encoder, whole, cut, with a
/// bad CRC, compressed, control, and the records of the Fetch answers captured from Apache Kafka)
/// and its hazards (`hazard-*` in `regressions/`: counts and lengths of 2^31 behind a valid CRC).
/// Run by hand when the batch format code changes:
/// `cargo test --lib fuzz_replay::write_record_batch_seeds -- --ignored`.
#[test]
#[ignore = "writes files; run by hand to refresh seeds"]
fn write_record_batch_seeds() {
    use crate::wire::codec::{decode_response, Response};
    use crate::wire::records::{encode_batch, Header, NewRecord};
    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::ApiKey;
    use kafka_protocol::protocol::StrBytes;

    fn batch(records: &[NewRecord], base_offset: i64) -> BytesMut {
        let mut out = BytesMut::new();
        encode_batch(records, &mut out).expect("encodes");
        out[..8].copy_from_slice(&base_offset.to_be_bytes());
        out
    }
    /// Sets attribute bits and makes the CRC right again, so decoding gets past it.
    fn with_attributes(mut b: BytesMut, bits: u8) -> BytesMut {
        b[22] |= bits;
        fix_crc(&mut b);
        b
    }
    fn fix_crc(b: &mut [u8]) {
        let crc = crc32c::crc32c(&b[21..]);
        b[17..21].copy_from_slice(&crc.to_be_bytes());
    }
    /// A valid header with `count` records and `records` as the records section.
    fn handmade(count: i32, records: &[u8]) -> BytesMut {
        let mut b = batch(&[NewRecord::default()], 0);
        b.truncate(61);
        b[57..61].copy_from_slice(&count.to_be_bytes());
        b.extend_from_slice(records);
        let len = (b.len() - 12) as i32;
        b[8..12].copy_from_slice(&len.to_be_bytes());
        fix_crc(&mut b);
        b
    }

    let one = NewRecord {
        timestamp: 1_764_547_200_000,
        key: Some(Bytes::from_static(b"lock-a")),
        value: Some(Bytes::from_static(b"ACQUIRED member=m-1 generation=1")),
        headers: vec![Header {
            key: StrBytes::from_static_str("kind"),
            value: Some(Bytes::from_static(b"ACQUIRED")),
        }],
    };
    let three = vec![
        one.clone(),
        NewRecord {
            timestamp: 1_764_547_100_000,
            ..NewRecord::default()
        },
        NewRecord {
            timestamp: 1_764_547_300_000,
            key: Some(Bytes::new()),
            value: Some(Bytes::from(vec![b'x'; 200])),
            headers: vec![
                Header {
                    key: StrBytes::from_static_str("k"),
                    value: None,
                },
                Header {
                    key: StrBytes::from_static_str("k"),
                    value: Some(Bytes::new()),
                },
            ],
        },
    ];
    let mut two_batches = batch(std::slice::from_ref(&one), 0);
    two_batches.extend_from_slice(&batch(&three, 1));
    let mut truncated = two_batches.clone();
    truncated.truncate(two_batches.len() - 40);
    let mut bad_crc = batch(&three, 5);
    let last = bad_crc.len() - 1;
    bad_crc[last] ^= 0x20;
    let bad_crc_again = bad_crc.to_vec();
    let mut magic_1 = batch(std::slice::from_ref(&one), 0);
    magic_1[16] = 1;

    let mut seeds: Vec<(String, Vec<u8>)> = vec![
        (
            "one-record".into(),
            batch(std::slice::from_ref(&one), 0).to_vec(),
        ),
        ("three-records".into(), batch(&three, 41).to_vec()),
        ("two-batches".into(), two_batches.to_vec()),
        ("truncated".into(), truncated.to_vec()),
        ("bad-crc".into(), bad_crc.to_vec()),
        (
            "gzip-header".into(),
            with_attributes(batch(&three, 0), 1).to_vec(),
        ),
        (
            "zstd-header".into(),
            with_attributes(batch(&three, 0), 4).to_vec(),
        ),
        (
            "control".into(),
            with_attributes(batch(&[NewRecord::default()], 9), 0x30).to_vec(),
        ),
        (
            "log-append-time".into(),
            with_attributes(batch(&three, 0), 0x08).to_vec(),
        ),
        ("magic-1".into(), magic_1.to_vec()),
    ];
    // The records of every captured Fetch answer that has some.
    let apache = Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/frames/apache");
    let mut files: Vec<_> = std::fs::read_dir(&apache)
        .expect("testdata/frames/apache")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("fetch_v18_") && n.ends_with(".bin"))
        .collect();
    files.sort();
    for file in files {
        let body = std::fs::read(apache.join(&file)).expect("readable");
        let Ok(Response::Fetch(resp)) = decode_response(ApiKey::Fetch, 18, &body) else {
            panic!("{file} decodes");
        };
        for p in resp.responses.iter().flat_map(|t| &t.partitions) {
            if let Some(records) = p.records.as_ref().filter(|r| !r.is_empty()) {
                let name = file.trim_end_matches(".bin").replace('_', "-");
                seeds.push((format!("apache-{name}"), records.to_vec()));
            }
        }
    }
    // The control byte of `record_batch_decode`: 0 decodes the bytes as they are, 1 fixes the
    // CRCs first (one seed, so that the fuzzer starts with both).
    let dir = fuzz_dir().join("corpus/record_batch_decode");
    std::fs::create_dir_all(&dir).expect("corpus directory");
    for (name, data) in seeds {
        let input = [&[0u8][..], &data].concat();
        std::fs::write(dir.join(format!("seed-{name}")), input).expect("seed written");
    }
    let fixed = [&[1u8][..], &bad_crc_again].concat();
    std::fs::write(dir.join("seed-bad-crc-fixed"), fixed).expect("seed written");

    // Counts and lengths of 2^31 - 1 behind a valid CRC: reserving for any of them would take
    // tens of gigabytes.
    let mut huge_batch = BytesMut::new();
    huge_batch.extend_from_slice(&0i64.to_be_bytes());
    huge_batch.extend_from_slice(&i32::MAX.to_be_bytes());
    huge_batch.extend_from_slice(&[0, 0, 0, 0, 2, 0, 0, 0, 0]);
    let mut negative = batch(&[one], 0);
    negative[8..12].copy_from_slice(&(-2i32).to_be_bytes());
    let hazards: [(&str, Vec<u8>); 5] = [
        ("record-count", handmade(i32::MAX, &[0; 14]).to_vec()),
        // One record: length 10, no key or value, then a header count of i32::MAX.
        (
            "header-count",
            handmade(1, &[20, 0, 0, 0, 1, 1, 0xfe, 0xff, 0xff, 0xff, 0x0f]).to_vec(),
        ),
        // A record, then its key, claiming i32::MAX bytes.
        (
            "record-length",
            handmade(1, &[0xfe, 0xff, 0xff, 0xff, 0x0f, 0, 0]).to_vec(),
        ),
        (
            "key-length",
            handmade(1, &[20, 0, 0, 0, 0xfe, 0xff, 0xff, 0xff, 0x0f, 1, 0]).to_vec(),
        ),
        ("batch-length", huge_batch.to_vec()),
    ];
    let dir = fuzz_dir().join("regressions/record_batch_decode");
    std::fs::create_dir_all(&dir).expect("regressions directory");
    for (name, data) in hazards {
        let input = [&[0u8][..], &data].concat();
        std::fs::write(dir.join(format!("hazard-{name}")), input).expect("hazard written");
    }
    let input = [&[0u8][..], &negative].concat();
    std::fs::write(dir.join("hazard-negative-batch-length"), input).expect("hazard written");
}

/// Writes the ledger-record seeds of `peer_bytes` (`seed-ledger-*`: one record of each kind from
/// our encoder) and its hazards (`hazard-ledger-*` in `regressions/`: lengths far beyond the
/// bytes that follow). Run by hand when the record format changes:
/// `cargo test --lib fuzz_replay::write_ledger_seeds -- --ignored`.
#[test]
#[ignore = "writes files; run by hand to refresh seeds"]
fn write_ledger_seeds() {
    use crate::ledger::{LedgerRecord, RecordKind};
    let record = |kind, hold| LedgerRecord {
        unix_ms: 1_800_000_000_000,
        hold,
        generation: 3,
        member_id: "kafka-lock-0f0e".into(),
        label: Some("job".into()),
        host: Some("host".into()),
        pid: Some(42),
        slot: 0,
        kind,
    };
    let seeds = [
        (
            "acquired",
            record(RecordKind::Acquired { lease_ms: 9000 }, -1),
        ),
        (
            "released",
            record(RecordKind::Released { held_ms: 1500 }, 7),
        ),
        (
            "lost",
            record(
                RecordKind::Lost {
                    held_ms: 3,
                    reason: "fenced".into(),
                    detail: "UNKNOWN_MEMBER_ID".into(),
                },
                7,
            ),
        ),
        (
            "checkpoint",
            record(
                RecordKind::Checkpoint {
                    value: "2026-11-29".into(),
                },
                7,
            ),
        ),
    ];
    let corpus = fuzz_dir().join("corpus/peer_bytes");
    for (name, r) in &seeds {
        std::fs::write(corpus.join(format!("seed-ledger-{name}")), r.encode()).expect("seed");
    }
    // A stream of records, zero-separated as `fuzz_ledger_bytes` cuts them: the history fold.
    let mut stream = Vec::new();
    for (_, r) in &seeds {
        stream.extend_from_slice(&r.encode());
        stream.push(0);
    }
    std::fs::write(corpus.join("seed-ledger-stream"), stream).expect("seed");
    let regressions = fuzz_dir().join("regressions/peer_bytes");
    let good = seeds[1].1.encode();
    // The member id's length field claims 32767 bytes; five follow.
    let mut member = good[..22].to_vec();
    member.extend_from_slice(&[0x7f, 0xff, b'a', b'b', b'c', b'd', b'e']);
    std::fs::write(regressions.join("hazard-ledger-member-id-length"), member).expect("hazard");
    // A label length just below the "none" marker: over the bound, refused before any read.
    let mut label = good[..22].to_vec();
    label.extend_from_slice(&[0, 1, b'm', 0xff, 0xfe]);
    std::fs::write(regressions.join("hazard-ledger-label-length"), label).expect("hazard");
}

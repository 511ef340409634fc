//! Golden tests: Produce and Fetch answers captured from Apache Kafka 4.1.2
//! (`testdata/frames/apache/`, see `testdata/README.md`), decoded through the guard and read with
//! [`produced`], [`fetched`] and [`RecordBatches`]. The batches in them were written by our encoder
//! (and, on a second topic, by Kafka's own Java producer), so these tests prove the encoder against
//! the broker (which checks every batch's CRC and layout before appending it) and the decoder
//! against what the broker sends back.
//!
//! `capture_apache_frames` (ignored) regenerates the files. Topic ids, producer ids and the Java
//! records' timestamps change with each capture; the tests assert what does not.

use std::path::PathBuf;

use bytes::BytesMut;
use kafka_protocol::messages::ApiKey;

use super::*;
use crate::wire::codec::{decode_response, Response};
use crate::wire::records::{BatchError, Header, NewRecord, Record, RecordBatch};

const LEDGER_TOPIC: &str = "capture-ledger";
const JAVA_TOPIC: &str = "capture-java";
/// Our batches as appended, in order: the Produce version that carried each, and its records.
const PRODUCE_VERSIONS: [i16; 5] = [3, 8, 9, 12, 13];
const FETCH_VERSIONS: [i16; 6] = [4, 11, 12, 13, 17, 18];

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("testdata/frames/apache")
}

fn header(key: &'static str, value: Option<&'static str>) -> Header {
    Header {
        key: StrBytes::from_static_str(key),
        value: value.map(|v| Bytes::from_static(v.as_bytes())),
    }
}

fn ledger_record(at: i64, key: &'static str, value: Option<&'static str>) -> NewRecord {
    let kind = value.map(|v| v.split(' ').next().unwrap_or(""));
    NewRecord {
        timestamp: 1_764_547_200_000 + at * 1000,
        key: Some(Bytes::from_static(key.as_bytes())),
        value: value.map(|v| Bytes::from_static(v.as_bytes())),
        headers: kind
            .map(|k| vec![header("kind", Some(k)), header("trace", None)])
            .unwrap_or_default(),
    }
}

/// The batches the capture appends to [`LEDGER_TOPIC`], one per entry of [`PRODUCE_VERSIONS`].
fn appended() -> Vec<Vec<NewRecord>> {
    let long = NewRecord {
        timestamp: 1_764_547_260_000,
        key: Some(Bytes::from_static(b"lock-d")),
        value: Some(Bytes::from(vec![b'x'; 300])),
        headers: vec![
            header("kind", Some("ACQUIRED")),
            header("kind", Some("again")),
        ],
    };
    vec![
        vec![ledger_record(
            0,
            "lock-a",
            Some("ACQUIRED member=m-1 generation=1"),
        )],
        vec![
            ledger_record(5, "lock-a", Some("RELEASED member=m-1 generation=1")),
            ledger_record(4, "lock-b", Some("ACQUIRED member=m-2 generation=3")),
        ],
        vec![ledger_record(6, "lock-c", None)],
        vec![
            ledger_record(7, "lock-b", Some("LOST member=m-2 generation=3")),
            ledger_record(8, "lock-a", Some("ACQUIRED member=m-3 generation=2")),
            ledger_record(9, "lock-a", Some("RELEASED member=m-3 generation=2")),
        ],
        vec![long],
    ]
}

/// Every record of [`appended`], with the offsets the broker gave them.
fn appended_records() -> Vec<Record> {
    appended()
        .into_iter()
        .flatten()
        .zip(0..)
        .map(|(r, offset)| Record {
            offset,
            timestamp: r.timestamp,
            key: r.key,
            value: r.value,
            headers: r.headers,
        })
        .collect()
}

fn index() -> serde_json::Value {
    let text = std::fs::read_to_string(dir().join("index.json")).expect("apache/index.json");
    serde_json::from_str(&text).expect("valid index.json")
}

fn topic(name: &str) -> TopicPartition {
    let id = index()["topics"][name]
        .as_str()
        .and_then(|s| Uuid::parse_str(s).ok())
        .unwrap_or_else(|| panic!("index.json names the id of {name}"));
    TopicPartition::new(name, 0).with_topic_id(id)
}

fn decode(file: &str) -> Response {
    let (api, version) = if let Some(rest) = file.strip_prefix("produce_v") {
        (ApiKey::Produce, rest)
    } else {
        (
            ApiKey::Fetch,
            file.strip_prefix("fetch_v").expect("produce_ or fetch_"),
        )
    };
    let version: i16 = version.split('_').next().unwrap().parse().unwrap();
    let body = std::fs::read(dir().join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
    decode_response(api, version, &body).unwrap_or_else(|e| panic!("{file}: {e}"))
}

fn fetch(file: &str, tp: &TopicPartition) -> Result<Fetched, LogError> {
    let version = file["fetch_v".len()..]
        .split('_')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let Response::Fetch(resp) = decode(file) else {
        panic!("{file}: not a Fetch answer")
    };
    fetched(&resp, tp, version)
}

fn batches(f: &Fetched) -> (Vec<RecordBatch>, RecordBatches) {
    let mut it = f.batches();
    let batches = it.by_ref().map(|b| b.expect("a valid batch")).collect();
    (batches, it)
}

#[test]
fn every_captured_file_is_indexed_and_decodes() {
    let index = index();
    let files = index["files"].as_array().unwrap();
    let mut listed: Vec<&str> = files.iter().map(|f| f["file"].as_str().unwrap()).collect();
    listed.sort();
    let mut present: Vec<String> = std::fs::read_dir(dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    present.sort();
    assert_eq!(listed, present);
    for file in listed {
        decode(file);
    }
}

#[test]
fn our_batches_were_appended_at_consecutive_offsets() {
    let tp = topic(LEDGER_TOPIC);
    let mut next = 0;
    for (version, batch) in PRODUCE_VERSIONS.into_iter().zip(appended()) {
        let file = format!("produce_v{version}_appended.bin");
        let Response::Produce(resp) = decode(&file) else {
            unreachable!()
        };
        let appended = produced(&resp, &tp, version).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(appended.base_offset, next, "{file}");
        assert_eq!(
            appended.log_append_time, None,
            "{file}: the topic uses CreateTime"
        );
        assert_eq!(appended.log_start_offset, if version >= 5 { 0 } else { -1 });
        next += batch.len() as i64;
    }
}

#[test]
fn a_produce_to_a_missing_partition_is_the_brokers_error() {
    let Response::Produce(resp) = decode("produce_v12_unknown_partition.bin") else {
        unreachable!()
    };
    let tp = TopicPartition::new(LEDGER_TOPIC, 1);
    let err = produced(&resp, &tp, 12).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Broker {
                code: KafkaCode(3),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn fetches_from_the_start_return_our_records_at_every_version() {
    let tp = topic(LEDGER_TOPIC);
    for version in FETCH_VERSIONS {
        let file = format!("fetch_v{version}_from_start.bin");
        let f = fetch(&file, &tp).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert_eq!(f.high_watermark, 8, "{file}");
        assert_eq!(f.last_stable_offset, 8, "{file}");
        let (batches, it) = batches(&f);
        let bases: Vec<i64> = batches.iter().map(|b| b.base_offset).collect();
        assert_eq!(bases, [0, 1, 3, 4, 7], "{file}");
        let records: Vec<Record> = batches.into_iter().flat_map(|b| b.records).collect();
        assert_eq!(records, appended_records(), "{file}");
        assert_eq!(it.next_offset(), Some(8));
        assert_eq!((it.truncated(), it.control_batches()), (None, 0));
    }
}

#[test]
fn the_broker_sets_the_leader_epoch_and_keeps_the_rest_of_our_header() {
    let f = fetch("fetch_v18_from_start.bin", &topic(LEDGER_TOPIC)).unwrap();
    for b in batches(&f).0 {
        assert_eq!(b.partition_leader_epoch, 0);
        assert_eq!((b.producer_id, b.transactional), (-1, false));
    }
}

#[test]
fn a_fetch_cut_by_its_size_limit_stops_at_the_last_whole_batch() {
    let f = fetch("fetch_v18_cut.bin", &topic(LEDGER_TOPIC)).unwrap();
    let (batches, it) = batches(&f);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].records, appended_records()[..1]);
    assert_eq!(it.next_offset(), Some(1));
    let cut = it.truncated().expect("the broker cut the second batch");
    assert_eq!(cut.at, f.records.len() - cut.available);
    assert!(cut.needed.unwrap() > cut.available, "{cut:?}");
}

#[test]
fn a_fetch_from_inside_a_batch_returns_the_whole_batch() {
    let f = fetch("fetch_v12_mid_batch.bin", &topic(LEDGER_TOPIC)).unwrap();
    let (batches, it) = batches(&f);
    let offsets: Vec<i64> = batches
        .iter()
        .flat_map(|b| &b.records)
        .map(|r| r.offset)
        .collect();
    assert_eq!(offsets, [4, 5, 6, 7]);
    assert_eq!(it.next_offset(), Some(8));
}

#[test]
fn a_long_poll_that_times_out_is_empty() {
    let f = fetch("fetch_v18_long_poll_empty.bin", &topic(LEDGER_TOPIC)).unwrap();
    assert_eq!(f.high_watermark, 8);
    assert!(f.records.is_empty());
    let (batches, it) = batches(&f);
    assert!(batches.is_empty());
    assert_eq!((it.next_offset(), it.truncated()), (None, None));
}

#[test]
fn a_fetch_past_the_end_is_offset_out_of_range() {
    let err = fetch("fetch_v18_out_of_range.bin", &topic(LEDGER_TOPIC)).unwrap_err();
    assert!(
        matches!(
            err,
            LogError::Broker {
                code: KafkaCode(1),
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn java_producer_batches_decode_and_its_gzip_batch_is_a_typed_error() {
    let f = fetch("fetch_v18_java_producer.bin", &topic(JAVA_TOPIC)).unwrap();
    let mut it = f.batches();
    let plain = it.next().unwrap().expect("the uncompressed batch");
    assert!(plain.producer_id >= 0, "the Java producer is idempotent");
    let keys: Vec<&[u8]> = plain
        .records
        .iter()
        .map(|r| r.key.as_deref().unwrap())
        .collect();
    assert_eq!(keys, [&b"java-0"[..], b"java-1", b"java-2"]);
    for (i, r) in plain.records.iter().enumerate() {
        assert_eq!(r.offset, i as i64);
        assert_eq!(r.value.as_deref(), Some(format!("value-{i}").as_bytes()));
        assert_eq!(r.headers, [header("source", Some("java"))]);
        assert!(r.timestamp > 1_700_000_000_000);
    }
    assert_eq!(
        it.next(),
        Some(Err(BatchError::Compressed {
            base_offset: 3,
            last_offset: 5,
            codec: 1
        }))
    );
    assert_eq!(it.next(), None);
    assert_eq!(it.next_offset(), Some(3));
}

// ---------------------------------------------------------------------------------------------
// The capture.

/// Regenerates `testdata/frames/apache/`: run against a fresh Apache Kafka 4.1 (the topics must
/// not exist yet), with the broker's jars for Kafka's own Java client:
///
/// ```text
/// python3 scripts/local_kafka.py --initial-delay-ms 0     # prints bootstrap=127.0.0.1:PORT
/// KAFKA_LOCK_CAPTURE_BOOTSTRAP=127.0.0.1:PORT KAFKA_LOCK_KAFKA_LIBS=.tools/kafka/libs \
///     cargo test --lib capture_apache_frames -- --ignored
/// ```
///
/// It creates both topics and writes the Java producer's batches through
/// `scripts/ApacheTopics.java`, then speaks to the broker through this crate's wire layer over a
/// plain blocking socket: ApiVersions, Metadata (for the topic ids), our batches appended with
/// Produce at several versions, and Fetches of several shapes. Each answer's body (no length
/// prefix, no response header) is saved as `<api>_v<version>_<case>.bin`, listed in `index.json`.
#[test]
#[ignore = "needs a fresh Apache Kafka; writes testdata/frames/apache/"]
fn capture_apache_frames() {
    let bootstrap = std::env::var("KAFKA_LOCK_CAPTURE_BOOTSTRAP")
        .expect("KAFKA_LOCK_CAPTURE_BOOTSTRAP=host:port of a fresh Apache Kafka");
    let libs =
        std::env::var("KAFKA_LOCK_KAFKA_LIBS").unwrap_or_else(|_| ".tools/kafka/libs".into());
    let java = |args: &[&str]| {
        let root = env!("CARGO_MANIFEST_DIR");
        let out = std::process::Command::new("java")
            .arg("-cp")
            .arg(format!("{libs}/*"))
            .arg(format!("{root}/scripts/ApacheTopics.java"))
            .args(args)
            .output()
            .expect("java runs");
        assert!(
            out.status.success(),
            "ApacheTopics {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    java(&["create", &bootstrap, LEDGER_TOPIC, "1"]);
    java(&["create", &bootstrap, JAVA_TOPIC, "1"]);
    java(&["produce", &bootstrap, JAVA_TOPIC, "none", "3"]);
    java(&["produce", &bootstrap, JAVA_TOPIC, "gzip", "3"]);
    let broker = std::fs::read_dir(&libs)
        .expect("the broker's jars")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .find_map(|n| {
            Some(
                n.strip_prefix("kafka_2.13-")?
                    .strip_suffix(".jar")?
                    .to_owned(),
            )
        })
        .map(|v| format!("Apache Kafka {v}"))
        .expect("kafka_2.13-<version>.jar");

    let out = dir();
    std::fs::create_dir_all(&out).unwrap();
    for entry in std::fs::read_dir(&out).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "bin") {
            std::fs::remove_file(path).unwrap();
        }
    }
    let mut c = capture::Conn::open(&bootstrap, out.clone());
    let ids: Vec<(&str, Uuid)> = [LEDGER_TOPIC, JAVA_TOPIC]
        .into_iter()
        .map(|t| (t, c.topic_id(t)))
        .collect();
    let ledger = TopicPartition::new(LEDGER_TOPIC, 0).with_topic_id(ids[0].1);
    let java_topic = TopicPartition::new(JAVA_TOPIC, 0).with_topic_id(ids[1].1);

    for (version, records) in PRODUCE_VERSIONS.into_iter().zip(appended()) {
        let mut batch = BytesMut::new();
        crate::wire::records::encode_batch(&records, &mut batch).unwrap();
        let req = produce_request(&ledger, batch.freeze(), Duration::from_secs(10), version);
        c.save(req.unwrap().into(), version, "appended");
    }
    let mut batch = BytesMut::new();
    crate::wire::records::encode_batch(&appended()[0], &mut batch).unwrap();
    let missing = TopicPartition::new(LEDGER_TOPIC, 1);
    let req = produce_request(&missing, batch.freeze(), Duration::from_secs(10), 12);
    c.save(req.unwrap().into(), 12, "unknown_partition");

    let everything = FetchOptions {
        max_wait: Duration::from_millis(100),
        ..FetchOptions::default()
    };
    let mut first_batch = 0;
    for version in FETCH_VERSIONS {
        let req = fetch_request(&ledger, 0, &everything, version).unwrap();
        let Response::Fetch(resp) = c.save(req.into(), version, "from_start") else {
            unreachable!()
        };
        let records = fetched(&resp, &ledger, version).unwrap().records;
        first_batch = 12 + i32::from_be_bytes(records[8..12].try_into().unwrap()) as usize;
    }
    let cut = FetchOptions {
        max_bytes: (first_batch + 30) as i32,
        ..everything
    };
    c.save(
        fetch_request(&ledger, 0, &cut, 18).unwrap().into(),
        18,
        "cut",
    );
    let req = fetch_request(&ledger, 5, &everything, 12).unwrap();
    c.save(req.into(), 12, "mid_batch");
    let poll = FetchOptions {
        max_wait: Duration::from_millis(300),
        ..everything
    };
    c.save(
        fetch_request(&ledger, 8, &poll, 18).unwrap().into(),
        18,
        "long_poll_empty",
    );
    let req = fetch_request(&ledger, 100, &everything, 18).unwrap();
    c.save(req.into(), 18, "out_of_range");
    let req = fetch_request(&java_topic, 0, &everything, 18).unwrap();
    c.save(req.into(), 18, "java_producer");

    let topics: serde_json::Map<String, serde_json::Value> = ids
        .iter()
        .map(|(t, id)| (t.to_string(), id.to_string().into()))
        .collect();
    let index = serde_json::json!({
        "source": "apache",
        "broker": broker,
        "captured_by": "cargo test --lib capture_apache_frames -- --ignored (src/wire/log_golden.rs)",
        "format": "each .bin file is a response body: no 4-byte length prefix, no response header",
        "topics": topics,
        "files": c.files,
        "forwarded_not_saved": {},
    });
    let text = serde_json::to_string_pretty(&index).unwrap() + "\n";
    std::fs::write(out.join("index.json"), text).unwrap();
}

/// A blocking client for the capture, on the crate's own wire layer.
mod capture {
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::path::PathBuf;

    use bytes::{Bytes, BytesMut};
    use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
    use kafka_protocol::messages::{ApiKey, ApiVersionsRequest, MetadataRequest};
    use kafka_protocol::protocol::StrBytes;
    use uuid::Uuid;

    use crate::wire::codec::{decode_response_frame_bytes, encode_request, Request, Response};
    use crate::wire::guard::scan_response_header;
    use crate::wire::versions::{negotiate, NegotiatedVersions};

    pub(super) struct Conn {
        stream: TcpStream,
        correlation_id: i32,
        versions: NegotiatedVersions,
        out: PathBuf,
        pub(super) files: Vec<serde_json::Value>,
    }

    impl Conn {
        pub(super) fn open(bootstrap: &str, out: PathBuf) -> Self {
            let stream = TcpStream::connect(bootstrap).expect("the broker answers");
            let mut c = Conn {
                stream,
                correlation_id: 0,
                versions: NegotiatedVersions::default(),
                out,
                files: Vec::new(),
            };
            let req = ApiVersionsRequest::default()
                .with_client_software_name(StrBytes::from_static_str("kafka-lock-capture"))
                .with_client_software_version(StrBytes::from_static_str("0"));
            let Response::ApiVersions(resp) = c.call(req.into(), 3).1 else {
                unreachable!()
            };
            c.versions = negotiate(&resp).expect("versions");
            assert_eq!(
                c.versions.get(ApiKey::Produce),
                Some(13),
                "a Kafka 4.1 broker"
            );
            assert_eq!(
                c.versions.get(ApiKey::Fetch),
                Some(18),
                "a Kafka 4.1 broker"
            );
            c
        }

        pub(super) fn topic_id(&mut self, topic: &str) -> Uuid {
            let req = MetadataRequest::default()
                .with_topics(Some(vec![MetadataRequestTopic::default()
                    .with_name(Some(StrBytes::from_string(topic.to_owned()).into()))]));
            let Response::Metadata(resp) = self.call(req.into(), 12).1 else {
                unreachable!()
            };
            let t = &resp.topics[0];
            assert_eq!(t.error_code, 0, "{topic} exists");
            assert_eq!(t.partitions.len(), 1, "{topic} has one partition");
            t.topic_id
        }

        /// Sends `req`; returns the response header's length and the decoded response.
        fn call(&mut self, req: Request, version: i16) -> (Bytes, Response) {
            self.correlation_id += 1;
            let api = req.api_key();
            let mut out = BytesMut::new();
            encode_request(
                &req,
                version,
                self.correlation_id,
                Some("capture"),
                &mut out,
            )
            .unwrap();
            self.stream.write_all(&out).unwrap();
            let mut prefix = [0u8; 4];
            self.stream.read_exact(&mut prefix).unwrap();
            let mut frame = vec![0u8; i32::from_be_bytes(prefix) as usize];
            self.stream.read_exact(&mut frame).unwrap();
            let frame = Bytes::from(frame);
            let (_, header) =
                scan_response_header(&frame, api.response_header_version(version)).unwrap();
            let resp =
                decode_response_frame_bytes(frame.clone(), api, version, self.correlation_id)
                    .unwrap_or_else(|e| panic!("{api:?} v{version}: {e}"));
            (frame.slice(header..), resp)
        }

        /// Sends `req` and saves its answer's body as `<api>_v<version>_<case>.bin`.
        pub(super) fn save(&mut self, req: Request, version: i16, case: &str) -> Response {
            let api = req.api_key();
            let (body, resp) = self.call(req, version);
            let name = match api {
                ApiKey::Produce => "produce",
                ApiKey::Fetch => "fetch",
                other => panic!("{other:?} is not captured"),
            };
            let file = format!("{name}_v{version}_{case}.bin");
            std::fs::write(self.out.join(&file), &body).unwrap();
            self.files.push(serde_json::json!({
                "file": file,
                "api_key": api as i16,
                "api_version": version,
                "request_header_version": api.request_header_version(version),
                "response_header_version": api.response_header_version(version),
                "correlation_id": self.correlation_id,
                "client_id": "capture",
                "connection": 1,
                "body_bytes": body.len(),
            }));
            resp
        }
    }
}

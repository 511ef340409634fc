use super::*;
use crate::wire::codec::{decode_response, encode_request, Request, Response};
use crate::wire::frame::{decode_frame, DEFAULT_MAX_FRAME_SIZE};
use crate::wire::records::{encode_batch, NewRecord};
use bytes::BytesMut;
use kafka_protocol::messages::fetch_response::{
    AbortedTransaction, FetchableTopicResponse, PartitionData,
};
use kafka_protocol::messages::produce_response::{
    BatchIndexAndErrorMessage, PartitionProduceResponse, TopicProduceResponse,
};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable};

const ID: Uuid = Uuid::from_u128(0x0123_4567_89ab_cdef_0123_4567_89ab_cdef);

fn tp() -> TopicPartition {
    TopicPartition::new("ledger", 0).with_topic_id(ID)
}

fn batch() -> Bytes {
    let mut out = BytesMut::new();
    let record = NewRecord {
        timestamp: 1,
        value: Some(Bytes::from_static(b"ACQUIRED")),
        ..NewRecord::default()
    };
    encode_batch(&[record], &mut out).unwrap();
    out.freeze()
}

/// Frames `req` at `version` and decodes it back as a broker would.
fn through_the_wire<T: Decodable>(req: Request, version: i16) -> T {
    let mut out = BytesMut::new();
    encode_request(&req, version, 3, Some("t"), &mut out).unwrap();
    let mut frame = decode_frame(&mut out, DEFAULT_MAX_FRAME_SIZE)
        .unwrap()
        .unwrap();
    let header = decode_request_header_from_buffer(&mut frame).unwrap();
    assert_eq!(header.request_api_version, version);
    let decoded = T::decode(&mut frame, version).unwrap();
    assert!(frame.is_empty());
    decoded
}

#[test]
fn produce_requests_at_every_version_carry_the_batch_with_acks_all() {
    for version in 3..=13 {
        let req = produce_request(&tp(), batch(), Duration::from_secs(5), version).unwrap();
        let got: ProduceRequest = through_the_wire(req.into(), version);
        assert_eq!(got.acks, -1);
        assert_eq!(got.timeout_ms, 5000);
        assert_eq!(got.transactional_id, None);
        let [topic] = &got.topic_data[..] else {
            panic!("v{version}: {got:?}")
        };
        if version >= TOPIC_ID_VERSION {
            assert_eq!(topic.topic_id, ID, "v{version}");
        } else {
            assert_eq!(topic.name.0.as_str(), "ledger", "v{version}");
        }
        let [p] = &topic.partition_data[..] else {
            panic!("v{version}")
        };
        assert_eq!((p.index, p.records.as_ref()), (0, Some(&batch())));
    }
}

#[test]
fn topic_ids_are_required_from_v13_only() {
    let no_id = TopicPartition::new("ledger", 0);
    let err = produce_request(&no_id, batch(), Duration::ZERO, 13).unwrap_err();
    assert_eq!(
        err,
        LogError::TopicIdRequired {
            api: ApiKey::Produce,
            version: 13
        }
    );
    assert!(err.to_string().contains("Metadata v10"), "{err}");
    assert!(produce_request(&no_id, batch(), Duration::ZERO, 12).is_ok());
    let options = FetchOptions::default();
    assert!(fetch_request(&no_id, 0, &options, 12).is_ok());
    assert!(matches!(
        fetch_request(&no_id, 0, &options, 13),
        Err(LogError::TopicIdRequired { .. })
    ));
}

#[test]
fn timeouts_saturate() {
    let req = produce_request(&tp(), batch(), Duration::MAX, 9).unwrap();
    assert_eq!(req.timeout_ms, i32::MAX);
    let options = FetchOptions {
        max_wait: Duration::from_secs(u64::MAX),
        ..FetchOptions::default()
    };
    assert_eq!(
        fetch_request(&tp(), 0, &options, 12).unwrap().max_wait_ms,
        i32::MAX
    );
}

#[test]
fn fetch_requests_at_every_version_are_sessionless_consumer_fetches() {
    let options = FetchOptions {
        max_wait: Duration::from_millis(30_000),
        min_bytes: 1,
        max_bytes: 4096,
        isolation: Isolation::ReadCommitted,
    };
    for version in 4..=18 {
        let req = fetch_request(&tp(), 42, &options, version).unwrap();
        let got: FetchRequest = through_the_wire(req.into(), version);
        assert_eq!(got.max_wait_ms, 30_000);
        assert_eq!((got.min_bytes, got.max_bytes), (1, 4096));
        assert_eq!(got.isolation_level, 1);
        if version >= 7 {
            assert_eq!((got.session_id, got.session_epoch), (0, -1), "v{version}");
        }
        if version <= 14 {
            assert_eq!(got.replica_id.0, -1, "v{version}");
        } else {
            assert_eq!(got.replica_state.replica_id.0, -1, "v{version}");
        }
        let [topic] = &got.topics[..] else {
            panic!("v{version}")
        };
        if version >= TOPIC_ID_VERSION {
            assert_eq!(topic.topic_id, ID);
        } else {
            assert_eq!(topic.topic.0.as_str(), "ledger");
        }
        let [p] = &topic.partitions[..] else {
            panic!("v{version}")
        };
        assert_eq!((p.partition, p.fetch_offset), (0, 42));
        assert_eq!(p.partition_max_bytes, 4096);
        assert_eq!(p.current_leader_epoch, -1);
    }
    let uncommitted = FetchOptions {
        isolation: Isolation::ReadUncommitted,
        ..options
    };
    assert_eq!(
        fetch_request(&tp(), 0, &uncommitted, 4)
            .unwrap()
            .isolation_level,
        0
    );
}

#[test]
fn the_default_fetch_fits_the_default_frame() {
    let d = FetchOptions::default();
    assert!((d.max_bytes as usize) * 2 < DEFAULT_MAX_FRAME_SIZE);
    assert_eq!((d.min_bytes, d.isolation), (1, Isolation::ReadCommitted));
}

fn produce_answer(partition: PartitionProduceResponse) -> ProduceResponse {
    ProduceResponse::default().with_responses(vec![
        TopicProduceResponse::default()
            .with_name(StrBytes::from_static_str("other").into())
            .with_partition_responses(vec![PartitionProduceResponse::default().with_index(0)]),
        TopicProduceResponse::default()
            .with_name(StrBytes::from_static_str("ledger").into())
            .with_topic_id(ID)
            .with_partition_responses(vec![partition]),
    ])
}

/// Encodes `resp` at `version` and decodes it through the guard, as a connection would.
fn through_the_guard(resp: Response, version: i16) -> Response {
    let mut body = BytesMut::new();
    match &resp {
        Response::Produce(r) => r.encode(&mut body, version).unwrap(),
        Response::Fetch(r) => r.encode(&mut body, version).unwrap(),
        _ => unreachable!(),
    }
    decode_response(resp.api_key(), version, &body).unwrap()
}

#[test]
fn produce_answers_give_the_base_offset_or_the_broker_error() {
    let ok = PartitionProduceResponse::default()
        .with_base_offset(17)
        .with_log_append_time_ms(-1)
        .with_log_start_offset(3);
    for version in [3, 8, 12, 13] {
        let Response::Produce(resp) = through_the_guard(produce_answer(ok.clone()).into(), version)
        else {
            unreachable!()
        };
        let appended = produced(&resp, &tp(), version).unwrap();
        assert_eq!((appended.base_offset, appended.log_append_time), (17, None));
        let start = if version >= 5 { 3 } else { -1 };
        assert_eq!(appended.log_start_offset, start);
        let other = TopicPartition::new("ledger", 1).with_topic_id(ID);
        assert!(matches!(
            produced(&resp, &other, version),
            Err(LogError::Missing { partition: 1, .. })
        ));
    }
    let with_time = produce_answer(ok.with_log_append_time_ms(1_700_000_000_000));
    assert_eq!(
        produced(&with_time, &tp(), 12).unwrap().log_append_time,
        Some(1_700_000_000_000)
    );

    let not_leader = PartitionProduceResponse::default()
        .with_error_code(6)
        .with_error_message(Some(StrBytes::from_static_str("not the leader")));
    let err = produced(&produce_answer(not_leader), &tp(), 12).unwrap_err();
    assert_eq!(
        err,
        LogError::Broker {
            api: ApiKey::Produce,
            code: KafkaCode(6),
            message: Some("not the leader".into())
        }
    );
    assert!(err.to_string().contains("NOT_LEADER_OR_FOLLOWER"), "{err}");
    let invalid = PartitionProduceResponse::default()
        .with_error_code(87)
        .with_record_errors(vec![BatchIndexAndErrorMessage::default()
            .with_batch_index(0)
            .with_batch_index_error_message(Some(StrBytes::from_static_str("bad key")))]);
    let Err(LogError::Broker { message, .. }) = produced(&produce_answer(invalid), &tp(), 8) else {
        panic!()
    };
    assert_eq!(message.as_deref(), Some("record 0: bad key"));
}

fn fetch_answer(partition: PartitionData) -> FetchResponse {
    FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(StrBytes::from_static_str("ledger").into())
        .with_topic_id(ID)
        .with_partitions(vec![partition])])
}

#[test]
fn fetch_answers_give_the_batches_or_the_broker_error() {
    let mut two = BytesMut::from(&batch()[..]);
    two.extend_from_slice(&batch()[..20]);
    let data = PartitionData::default()
        .with_high_watermark(1)
        .with_last_stable_offset(1)
        .with_log_start_offset(0)
        .with_aborted_transactions(Some(vec![AbortedTransaction::default()
            .with_producer_id(7.into())
            .with_first_offset(0)]))
        .with_records(Some(two.freeze()));
    for version in [4, 11, 12, 13, 18] {
        let Response::Fetch(resp) = through_the_guard(fetch_answer(data.clone()).into(), version)
        else {
            unreachable!()
        };
        let f = fetched(&resp, &tp(), version).unwrap();
        assert_eq!(f.high_watermark, 1);
        assert_eq!(f.aborted_transactions, [(7, 0)]);
        let mut batches = f.batches();
        let b = batches.next().unwrap().unwrap();
        assert_eq!(b.records[0].value.as_deref(), Some(&b"ACQUIRED"[..]));
        assert!(batches.next().is_none());
        assert_eq!(batches.next_offset(), Some(1));
        assert_eq!(batches.truncated().unwrap().available, 20);
    }
    let empty = fetch_answer(PartitionData::default().with_records(None));
    let f = fetched(&empty, &tp(), 12).unwrap();
    assert!(f.records.is_empty() && f.batches().next().is_none());

    let out_of_range = fetch_answer(PartitionData::default().with_error_code(1));
    assert!(matches!(
        fetched(&out_of_range, &tp(), 12),
        Err(LogError::Broker {
            code: KafkaCode(1),
            ..
        })
    ));
    let whole = fetch_answer(PartitionData::default()).with_error_code(71);
    assert!(matches!(
        fetched(&whole, &tp(), 12),
        Err(LogError::Broker {
            code: KafkaCode(71),
            ..
        })
    ));
    // Named by id from v13: a topic with the right name but another id is not ours.
    let other_id = TopicPartition::new("ledger", 0).with_topic_id(Uuid::from_u128(9));
    assert!(matches!(
        fetched(&fetch_answer(PartitionData::default()), &other_id, 13),
        Err(LogError::Missing { .. })
    ));
    assert!(fetched(&fetch_answer(PartitionData::default()), &other_id, 12).is_ok());
}

#[test]
fn list_offsets_requests_ask_for_one_partition_at_every_version() {
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    for version in 1..=10 {
        for (spec, ts) in [(OffsetSpec::Earliest, -2), (OffsetSpec::Latest, -1)] {
            let req = list_offsets_request(
                &tp(),
                spec,
                Isolation::ReadCommitted,
                Duration::from_secs(2),
                version,
            );
            let got: ListOffsetsRequest = through_the_wire(req.into(), version);
            assert_eq!(got.replica_id.0, -1);
            let [t] = &got.topics[..] else {
                panic!("v{version}: {got:?}")
            };
            assert_eq!(t.name.0.as_str(), "ledger");
            let [p] = &t.partitions[..] else {
                panic!("v{version}")
            };
            assert_eq!((p.partition_index, p.timestamp), (0, ts), "v{version}");
            assert_eq!(got.isolation_level, i8::from(version >= 2), "v{version}");
            assert_eq!(got.timeout_ms, if version >= 10 { 2000 } else { 0 });
        }
    }
    let answer = |code: i16, offset: i64| {
        ListOffsetsResponse::default().with_topics(vec![ListOffsetsTopicResponse::default()
            .with_name(StrBytes::from_static_str("ledger").into())
            .with_partitions(vec![ListOffsetsPartitionResponse::default()
                .with_partition_index(0)
                .with_error_code(code)
                .with_offset(offset)])])
    };
    assert_eq!(listed(&answer(0, 42), &tp()), Ok(42));
    assert!(matches!(
        listed(&answer(6, -1), &tp()),
        Err(LogError::Broker {
            code: KafkaCode(6),
            ..
        })
    ));
    let other = TopicPartition::new("other", 0);
    assert!(matches!(
        listed(&answer(0, 42), &other),
        Err(LogError::Missing { .. })
    ));
}

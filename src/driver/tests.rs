//! Connection and bootstrap tests against a scripted peer that plays the broker: it decodes request
//! headers and bodies with kafka-protocol's broker-side decoders and writes responses byte by byte.

use std::collections::BTreeSet;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use kafka_protocol::messages::api_versions_response::ApiVersion;
use kafka_protocol::messages::find_coordinator_response::Coordinator;
use kafka_protocol::messages::metadata_request::MetadataRequestTopic;
use kafka_protocol::messages::{
    ApiKey, ApiVersionsRequest, ApiVersionsResponse, BrokerId, DescribeGroupsRequest,
    FindCoordinatorRequest, FindCoordinatorResponse, HeartbeatRequest, HeartbeatResponse,
    MetadataRequest, MetadataResponse, RequestHeader, ResponseHeader, TopicName,
};
use kafka_protocol::protocol::{decode_request_header_from_buffer, Decodable, Encodable, StrBytes};
use tokio::io::{duplex, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, DuplexStream};
use tokio::net::{TcpListener, TcpSocket};
use tokio::task::JoinHandle;

use super::bootstrap::rotate;
use super::dial::{order, Dialer, MAX_PENDING_LOOKUPS};
use super::*;
use crate::backoff::Backoff;
use crate::error::Error;
use crate::wire::frame::FrameError;
use crate::wire::{Request, Response};

/// What tansu 510f3e2 advertises (test-brokers.md), for the APIs kafka-lock uses.
const BROKER_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 0, 9),
    (ApiKey::OffsetFetch, 0, 9),
    (ApiKey::DescribeGroups, 0, 5),
];

/// Generous bound for events that must happen promptly; only reached when a test fails.
const PROMPTLY: Duration = Duration::from_secs(10);

fn api_versions(apis: &[(ApiKey, i16, i16)]) -> ApiVersionsResponse {
    ApiVersionsResponse::default().with_api_keys(
        apis.iter()
            .map(|&(key, min, max)| {
                ApiVersion::default()
                    .with_api_key(key as i16)
                    .with_min_version(min)
                    .with_max_version(max)
            })
            .collect(),
    )
}

/// The broker side of a connection, scripted by the test.
pub(super) struct Peer<S> {
    io: S,
    buf: BytesMut,
}

impl<S: AsyncRead + AsyncWrite + Unpin> Peer<S> {
    fn new(io: S) -> Self {
        Peer {
            io,
            buf: BytesMut::new(),
        }
    }

    /// The next complete frame body, or `None` once the client closed the stream.
    async fn read_frame(&mut self) -> Option<Bytes> {
        loop {
            if self.buf.len() >= 4 {
                let len = i32::from_be_bytes([self.buf[0], self.buf[1], self.buf[2], self.buf[3]]);
                let len = usize::try_from(len).expect("client sent a negative frame length");
                if self.buf.len() >= 4 + len {
                    self.buf.advance(4);
                    return Some(self.buf.split_to(len).freeze());
                }
            }
            if self.read_some().await == 0 {
                assert!(self.buf.is_empty(), "client closed mid-frame");
                return None;
            }
        }
    }

    async fn read_some(&mut self) -> usize {
        self.io
            .read_buf(&mut self.buf)
            .await
            .expect("peer read failed")
    }

    async fn recv(&mut self) -> (RequestHeader, Bytes) {
        let mut frame = tokio::time::timeout(PROMPTLY, self.read_frame())
            .await
            .expect("no request arrived")
            .expect("client closed the connection instead of sending a request");
        let header = decode_request_header_from_buffer(&mut frame).expect("bad request header");
        (header, frame)
    }

    async fn recv_as<R: Decodable>(&mut self, api: ApiKey) -> (RequestHeader, R) {
        let (header, mut body) = self.recv().await;
        assert_eq!(header.request_api_key, api as i16, "unexpected API");
        let req = R::decode(&mut body, header.request_api_version).expect("bad request body");
        assert!(body.is_empty(), "bytes left after the request body");
        (header, req)
    }

    async fn send<R: Encodable>(
        &mut self,
        api: ApiKey,
        version: i16,
        correlation_id: i32,
        body: &R,
    ) {
        let mut payload = BytesMut::new();
        ResponseHeader::default()
            .with_correlation_id(correlation_id)
            .encode(&mut payload, api.response_header_version(version))
            .expect("encode response header");
        body.encode(&mut payload, version)
            .expect("encode response body");
        let mut frame = BytesMut::new();
        frame.put_i32(payload.len() as i32);
        frame.put_slice(&payload);
        self.send_raw(&frame).await;
    }

    async fn reply<R: Encodable>(&mut self, header: &RequestHeader, body: &R) {
        let api = ApiKey::try_from(header.request_api_key).expect("known API key");
        self.send(api, header.request_api_version, header.correlation_id, body)
            .await;
    }

    async fn send_raw(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.expect("peer write failed");
    }

    /// Answers like [`Peer::reply`] unless the client has closed the connection; tells which.
    async fn reply_if_open(&mut self, header: &RequestHeader, body: &HeartbeatResponse) -> bool {
        let mut payload = BytesMut::new();
        let version = header.request_api_version;
        ResponseHeader::default()
            .with_correlation_id(header.correlation_id)
            .encode(
                &mut payload,
                ApiKey::Heartbeat.response_header_version(version),
            )
            .expect("encode response header");
        body.encode(&mut payload, version)
            .expect("encode response body");
        let mut frame = BytesMut::new();
        frame.put_i32(payload.len() as i32);
        frame.put_slice(&payload);
        self.io.write_all(&frame).await.is_ok() && self.io.flush().await.is_ok()
    }

    /// Answers the client's ApiVersions v3 with `apis`.
    async fn handshake(&mut self, apis: &[(ApiKey, i16, i16)]) {
        let (header, req) = self
            .recv_as::<ApiVersionsRequest>(ApiKey::ApiVersions)
            .await;
        assert_eq!(header.request_api_version, 3);
        assert_eq!(req.client_software_name.as_str(), "kafka-lock");
        assert!(!req.client_software_version.is_empty());
        self.reply(&header, &api_versions(apis)).await;
    }

    /// Waits for the client to close the stream, failing if it sends anything else first.
    async fn expect_closed(&mut self) {
        let next = tokio::time::timeout(PROMPTLY, self.read_frame())
            .await
            .expect("the client did not close the connection");
        assert!(
            next.is_none(),
            "expected the connection to close, got a frame"
        );
    }
}

async fn setup_with(cfg: ConnConfig, buffer: usize) -> (Connection, Peer<DuplexStream>) {
    let (client, server) = duplex(buffer);
    let mut peer = Peer::new(server);
    let (conn, ()) = tokio::join!(
        Connection::from_stream(client, "scripted-peer", &cfg),
        peer.handshake(BROKER_APIS)
    );
    (conn.expect("handshake failed"), peer)
}

async fn setup() -> (Connection, Peer<DuplexStream>) {
    setup_with(ConnConfig::default(), 64 * 1024).await
}

fn heartbeat(generation: i32) -> HeartbeatRequest {
    HeartbeatRequest::default()
        .with_group_id(StrBytes::from_string(format!("g{generation}")).into())
        .with_generation_id(generation)
        .with_member_id(StrBytes::from_static_str("m"))
}

fn heartbeat_throttle(resp: Response) -> i32 {
    match resp {
        Response::Heartbeat(r) => r.throttle_time_ms,
        other => panic!("expected a Heartbeat response, got {other:?}"),
    }
}

fn poisoned_by(err: &Error) -> &Error {
    match err {
        Error::Poisoned(reason) => reason,
        other => panic!("expected a poisoned-connection error, got {other:?}"),
    }
}

#[tokio::test]
async fn handshake_negotiates_highest_common_versions() {
    let (conn, _peer) = setup().await;
    let v = conn.versions();
    for &(api, _, broker_max) in BROKER_APIS {
        let Some((_, our_max)) = crate::wire::versions::supported_range(api) else {
            continue;
        };
        assert_eq!(v.get(api), Some(our_max.min(broker_max)), "{api:?}");
    }
    assert_eq!(conn.peer(), "scripted-peer");
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn pipelined_requests_are_answered_in_order() {
    let (conn, mut peer) = setup().await;
    let tasks: Vec<_> = (0..3)
        .map(|generation| {
            let conn = conn.clone();
            tokio::spawn(async move { (generation, conn.request(heartbeat(generation)).await) })
        })
        .collect();

    // All three arrive before any answer: they are pipelined, not serialised.
    let mut received = Vec::new();
    for _ in 0..3 {
        received.push(peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await);
    }
    let ids: Vec<i32> = received.iter().map(|(h, _)| h.correlation_id).collect();
    let unique: BTreeSet<i32> = ids.iter().copied().collect();
    assert_eq!(unique.len(), 3, "correlation ids must differ: {ids:?}");

    // Answer in order; each response echoes its request's generation so misrouting shows.
    for (header, req) in &received {
        let resp = HeartbeatResponse::default().with_throttle_time_ms(req.generation_id);
        peer.reply(header, &resp).await;
    }
    for task in tasks {
        let (generation, result) = task.await.expect("request task");
        assert_eq!(
            heartbeat_throttle(result.expect("request failed")),
            generation
        );
    }
    assert!(!conn.is_closed());
}

/// The writer waits for nothing but the tasks already runnable: a request is on the wire in
/// the wake-up it was queued in, with no time passing (the clock is paused and moves only when
/// the runtime waits for a timer), so a Heartbeat sent at its grid tick is not held to a later
/// one by a window that gathers writes.
#[tokio::test(start_paused = true)]
async fn a_request_goes_out_in_the_wakeup_it_was_queued_in() {
    let (conn, mut peer) = setup().await;
    for generation in 0..3 {
        let queued = tokio::time::Instant::now();
        let asked = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(heartbeat(generation)).await }
        });
        let (header, got) = peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        assert_eq!(got.generation_id, generation);
        assert_eq!(
            queued.elapsed(),
            Duration::ZERO,
            "the request waited for a timer before it was written"
        );
        peer.reply(&header, &HeartbeatResponse::default()).await;
        asked.await.unwrap().expect("request failed");
    }
}

/// Requests are encoded one after another into room the connection keeps: each frame the
/// broker reads is that request's alone, whatever the sizes before it, and a large one leaves
/// no large room behind.
#[tokio::test]
async fn each_request_is_encoded_alone_and_a_large_one_leaves_no_room_behind() {
    let (conn, mut peer) = setup().await;
    let member_id = |len: usize| "m".repeat(len);
    for (generation, len) in [
        (1, 1),
        (2, 300),
        (3, 2),
        (4, 100_000),
        (5, 7),
        (6, 40),
        (7, 1),
    ] {
        let request = heartbeat(generation).with_member_id(StrBytes::from_string(member_id(len)));
        let asked = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(request).await }
        });
        let (header, got) = tokio::time::timeout(
            PROMPTLY,
            peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat),
        )
        .await
        .expect("the request arrives");
        assert_eq!(
            (got.generation_id, got.member_id.len()),
            (generation, len),
            "request {generation} arrived other than it was sent"
        );
        peer.reply(&header, &HeartbeatResponse::default()).await;
        tokio::time::timeout(PROMPTLY, asked)
            .await
            .expect("answered")
            .unwrap()
            .expect("request failed");
    }
    assert!(
        conn.scratch_capacity() < super::conn::SCRATCH_KEPT,
        "the connection kept {} bytes of room after a large request",
        conn.scratch_capacity()
    );
}

/// An encode that panicked midway under the connection's encoding lock leaves nothing on the
/// wire: the next request, another lock's Heartbeat on the shared quick connection, arrives as
/// sent and is answered, and the connection stays open for the ones after it.
#[tokio::test]
async fn an_encode_that_panicked_midway_leaves_no_bytes_ahead_of_the_next_frame() {
    let (conn, mut peer) = setup().await;
    // A length prefix and part of a header, as `encode_request_as` writes them first.
    conn.spoil_scratch(&[0, 0, 0, 0, 0, 12, 0, 4]);
    for generation in [1, 2] {
        let asked = tokio::spawn({
            let conn = conn.clone();
            async move { conn.request(heartbeat(generation)).await }
        });
        let (header, got) = tokio::time::timeout(
            PROMPTLY,
            peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat),
        )
        .await
        .expect("the request arrives");
        assert_eq!(got.generation_id, generation);
        peer.reply(&header, &HeartbeatResponse::default()).await;
        tokio::time::timeout(PROMPTLY, asked)
            .await
            .expect("answered")
            .unwrap()
            .expect("request failed");
    }
    assert!(!conn.is_closed());
}

#[tokio::test]
async fn correlation_mismatch_poisons_in_flight_and_later_requests() {
    let (conn, mut peer) = setup().await;
    let a = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    let b = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(2)).await }
    });
    let (first, _) = peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
    let (second, _) = peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
    // Answer the newer request first: Kafka never does that, so the stream is out of step.
    peer.reply(&second, &HeartbeatResponse::default()).await;
    let _ = first;

    for task in [a, b] {
        let err = task.await.expect("task").expect_err("must fail");
        let reason = poisoned_by(&err);
        assert!(matches!(reason, Error::Decode(_)), "{reason:?}");
        assert!(err.to_string().contains("correlation"), "{err}");
    }
    let later = conn.request(heartbeat(3)).await.expect_err("later request");
    assert!(matches!(poisoned_by(&later), Error::Decode(_)));
    assert!(conn.is_closed());
    peer.expect_closed().await;
}

#[tokio::test]
async fn unsolicited_response_poisons() {
    let (conn, mut peer) = setup().await;
    peer.send(ApiKey::Heartbeat, 4, 77, &HeartbeatResponse::default())
        .await;
    tokio::time::timeout(PROMPTLY, conn.closed())
        .await
        .expect("connection must close");
    let err = conn.request(heartbeat(1)).await.expect_err("poisoned");
    poisoned_by(&err);
    assert!(err.to_string().contains("77"), "{err}");
    peer.expect_closed().await;
}

async fn bad_prefix_poisons(prefix: i32) -> Error {
    let (conn, mut peer) = setup().await;
    let task = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    peer.recv().await;
    peer.send_raw(&prefix.to_be_bytes()).await;
    let err = task.await.expect("task").expect_err("must fail");
    let later = conn.request(heartbeat(2)).await.expect_err("later");
    poisoned_by(&later);
    peer.expect_closed().await;
    err
}

#[tokio::test]
async fn oversized_frame_poisons() {
    let err = bad_prefix_poisons(i32::MAX).await;
    assert!(
        matches!(poisoned_by(&err), Error::Frame(FrameError::TooLarge { .. })),
        "{err:?}"
    );
}

#[tokio::test]
async fn negative_frame_length_poisons() {
    let err = bad_prefix_poisons(-1).await;
    assert!(matches!(poisoned_by(&err), Error::Frame(_)), "{err:?}");
}

#[tokio::test]
async fn undecodable_body_poisons() {
    let (conn, mut peer) = setup().await;
    let task = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    let (header, _) = peer.recv().await;
    // Correct header, then a body far too short for any Heartbeat version.
    let mut frame = BytesMut::new();
    frame.put_i32(5);
    frame.put_i32(header.correlation_id);
    frame.put_u8(0);
    peer.send_raw(&frame).await;
    let err = task.await.expect("task").expect_err("must fail");
    assert!(matches!(poisoned_by(&err), Error::Decode(_)), "{err:?}");
    peer.expect_closed().await;
}

#[tokio::test]
async fn peer_closing_mid_frame_fails_in_flight_with_io_error() {
    let (conn, mut peer) = setup().await;
    let task = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    let (header, _) = peer.recv().await;
    let mut partial = BytesMut::new();
    partial.put_i32(100);
    partial.put_i32(header.correlation_id);
    partial.put_slice(&[0; 6]);
    peer.send_raw(&partial).await;
    drop(peer);

    let err = task.await.expect("task").expect_err("must fail");
    match &err {
        Error::Io { source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::UnexpectedEof);
            assert!(source.to_string().contains("middle of a response"), "{err}");
        }
        other => panic!("expected an I/O error, got {other:?}"),
    }
    let later = conn.request(heartbeat(2)).await.expect_err("later");
    assert!(matches!(later, Error::Io { .. }), "{later:?}");
}

#[tokio::test(start_paused = true)]
async fn request_timeout_closes_the_connection() {
    let cfg = ConnConfig::default().with_request_timeout(Duration::from_secs(2));
    let (conn, mut peer) = setup_with(cfg, 64 * 1024).await;
    // A long-timeout request in flight alongside the one that will time out.
    let long = tokio::spawn({
        let conn = conn.clone();
        async move {
            conn.request_with_timeout(heartbeat(1), Duration::from_secs(60))
                .await
        }
    });
    peer.recv().await;
    let short = conn.request(heartbeat(2)).await.expect_err("must time out");
    match &short {
        Error::Timeout { op, after } => {
            assert_eq!(*after, Duration::from_secs(2));
            assert!(
                op.contains("Heartbeat") && op.contains("scripted-peer"),
                "{op}"
            );
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
    let err = long
        .await
        .expect("task")
        .expect_err("poisoned by the timeout");
    assert!(
        matches!(poisoned_by(&err), Error::Timeout { .. }),
        "{err:?}"
    );
    // The timed-out request was queued, so the peer sees it before the close.
    peer.recv().await;
    peer.expect_closed().await;
}

#[tokio::test(start_paused = true)]
async fn request_with_timeout_outlives_the_default() {
    let cfg = ConnConfig::default().with_request_timeout(Duration::from_secs(1));
    let (conn, mut peer) = setup_with(cfg, 64 * 1024).await;
    let task = tokio::spawn({
        let conn = conn.clone();
        async move {
            conn.request_with_timeout(heartbeat(7), Duration::from_secs(30))
                .await
        }
    });
    let (header, _) = peer.recv().await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    peer.reply(
        &header,
        &HeartbeatResponse::default().with_throttle_time_ms(7),
    )
    .await;
    let resp = task.await.expect("task").expect("long request");
    assert_eq!(heartbeat_throttle(resp), 7);
}

#[tokio::test]
async fn cancelled_request_after_write_does_not_desync() {
    let (conn, mut peer) = setup().await;
    let cancelled = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    let (header, _) = peer.recv().await;
    cancelled.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    // The orphaned response arrives and must be consumed, not handed to the next caller.
    peer.reply(
        &header,
        &HeartbeatResponse::default().with_throttle_time_ms(1),
    )
    .await;

    let (result, ()) = tokio::join!(conn.request(heartbeat(2)), async {
        let (header, req) = peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        assert_eq!(req.generation_id, 2);
        peer.reply(
            &header,
            &HeartbeatResponse::default().with_throttle_time_ms(2),
        )
        .await;
    });
    assert_eq!(heartbeat_throttle(result.expect("next request")), 2);
}

#[tokio::test]
async fn cancelled_requests_mid_write_and_queued_do_not_desync() {
    // A tiny pipe: the large request below can only be written in many pieces.
    let (conn, mut peer) = setup_with(ConnConfig::default(), 256).await;
    let topics: Vec<MetadataRequestTopic> = (0..200)
        .map(|i| {
            MetadataRequestTopic::default().with_name(Some(TopicName(StrBytes::from_string(
                format!("topic-with-a-long-name-{i:04}"),
            ))))
        })
        .collect();
    let big = MetadataRequest::default().with_topics(Some(topics));
    let cancelled = tokio::spawn({
        let conn = conn.clone();
        let big = big.clone();
        async move { conn.request(big).await }
    });
    // Some of the frame has arrived, not all of it.
    while peer.buf.len() < 4 {
        assert!(peer.read_some().await > 0);
    }
    let total =
        4 + u32::from_be_bytes([peer.buf[0], peer.buf[1], peer.buf[2], peer.buf[3]]) as usize;
    assert!(
        total > 4096 && peer.buf.len() < total,
        "{} of {total}",
        peer.buf.len()
    );
    // A second request queues behind the half-written one; its caller gives up too. It was
    // never written, so it must never be written.
    let queued = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(4)).await }
    });
    tokio::task::yield_now().await;
    cancelled.abort();
    queued.abort();
    assert!(cancelled.await.expect_err("aborted").is_cancelled());
    assert!(queued.await.expect_err("aborted").is_cancelled());

    let (header, req) = peer.recv_as::<MetadataRequest>(ApiKey::Metadata).await;
    assert_eq!(req.topics.map(|t| t.len()), Some(200));
    peer.reply(&header, &MetadataResponse::default()).await;

    let (result, ()) = tokio::join!(conn.request(heartbeat(5)), async {
        let (header, req) = peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        assert_eq!(req.generation_id, 5);
        peer.reply(
            &header,
            &HeartbeatResponse::default().with_throttle_time_ms(5),
        )
        .await;
    });
    assert_eq!(heartbeat_throttle(result.expect("next request")), 5);
}

#[tokio::test]
async fn kip511_fallback_retries_at_the_brokers_version() {
    let (client, server) = duplex(64 * 1024);
    let mut peer = Peer::new(server);
    let broker = async {
        let (header, _) = peer
            .recv_as::<ApiVersionsRequest>(ApiKey::ApiVersions)
            .await;
        assert_eq!(header.request_api_version, 3);
        // An old broker answers UNSUPPORTED_VERSION with a v0 body listing what it supports.
        let unsupported = api_versions(&[(ApiKey::ApiVersions, 0, 2)]).with_error_code(35);
        peer.send(ApiKey::ApiVersions, 0, header.correlation_id, &unsupported)
            .await;
        let (header, _) = peer
            .recv_as::<ApiVersionsRequest>(ApiKey::ApiVersions)
            .await;
        assert_eq!(header.request_api_version, 2);
        let mut apis = BROKER_APIS.to_vec();
        apis[0] = (ApiKey::ApiVersions, 0, 2);
        peer.reply(&header, &api_versions(&apis)).await;
    };
    let cfg = ConnConfig::default();
    let (conn, ()) = tokio::join!(Connection::from_stream(client, "old-broker", &cfg), broker);
    let conn = conn.expect("fallback handshake");
    assert_eq!(conn.versions().get(ApiKey::ApiVersions), Some(2));
    assert!(conn.versions().get(ApiKey::Heartbeat).is_some());
}

#[tokio::test]
async fn handshake_error_code_is_reported() {
    let (client, server) = duplex(64 * 1024);
    let mut peer = Peer::new(server);
    let broker = async {
        let (header, _) = peer
            .recv_as::<ApiVersionsRequest>(ApiKey::ApiVersions)
            .await;
        let resp = api_versions(BROKER_APIS).with_error_code(31); // CLUSTER_AUTHORIZATION_FAILED
        peer.reply(&header, &resp).await;
    };
    let cfg = ConnConfig::default();
    let (conn, ()) = tokio::join!(Connection::from_stream(client, "b", &cfg), broker);
    let err = conn.expect_err("handshake must fail");
    assert!(matches!(err, Error::Broker { .. }), "{err:?}");
    peer.expect_closed().await;
}

#[tokio::test]
async fn api_missing_on_the_broker_is_an_error_naming_it() {
    let (client, server) = duplex(64 * 1024);
    let mut peer = Peer::new(server);
    let without_describe: Vec<_> = BROKER_APIS
        .iter()
        .copied()
        .filter(|(k, _, _)| *k != ApiKey::DescribeGroups)
        .collect();
    let cfg = ConnConfig::default();
    let (conn, ()) = tokio::join!(
        Connection::from_stream(client, "b", &cfg),
        peer.handshake(&without_describe)
    );
    let conn = conn.expect("handshake");
    let err = conn
        .request(DescribeGroupsRequest::default())
        .await
        .expect_err("DescribeGroups is not available");
    assert!(err.to_string().contains("DescribeGroups"), "{err}");
    // Nothing went on the wire and the connection stays usable.
    assert!(!conn.is_closed());
    let (result, ()) = tokio::join!(conn.request(heartbeat(1)), async {
        let (header, _) = peer.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        peer.reply(&header, &HeartbeatResponse::default()).await;
    });
    result.expect("heartbeat");
}

#[tokio::test]
async fn close_fails_in_flight_requests_and_closes_the_socket() {
    let (conn, mut peer) = setup().await;
    let task = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    peer.recv().await;
    conn.close();
    let err = task.await.expect("task").expect_err("closed");
    assert!(matches!(err, Error::Closed), "{err:?}");
    assert!(matches!(
        conn.request(heartbeat(2)).await,
        Err(Error::Closed)
    ));
    peer.expect_closed().await;
}

#[tokio::test]
async fn dropping_the_last_handle_closes_the_socket() {
    let (conn, mut peer) = setup().await;
    let clone = conn.clone();
    drop(conn);
    // A clone keeps it open.
    let (result, ()) = tokio::join!(clone.request(heartbeat(1)), async {
        let (header, _) = peer.recv().await;
        peer.reply(&header, &HeartbeatResponse::default()).await;
    });
    result.expect("clone still works");
    drop(clone);
    peer.expect_closed().await;
}

#[tokio::test]
async fn find_coordinator_round_trip() {
    let (conn, mut peer) = setup().await;
    // The request's shape depends on the negotiated version (v4 batched the keys, KIP-699).
    let version = conn
        .versions()
        .get(ApiKey::FindCoordinator)
        .expect("negotiated");
    let key = StrBytes::from_static_str("lock-a");
    let req = if version >= 4 {
        FindCoordinatorRequest::default().with_coordinator_keys(vec![key.clone()])
    } else {
        FindCoordinatorRequest::default().with_key(key.clone())
    };
    let (result, ()) = tokio::join!(conn.request(req), async {
        let (header, req) = peer
            .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
            .await;
        assert_eq!(header.request_api_version, version);
        let mut resp = FindCoordinatorResponse::default();
        if version >= 4 {
            assert_eq!(req.coordinator_keys, vec![key.clone()]);
            resp = resp.with_coordinators(vec![Coordinator::default()
                .with_key(key.clone())
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(9092)]);
        } else {
            assert_eq!(req.key, key);
            resp = resp
                .with_node_id(BrokerId(1))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(9092);
        }
        peer.reply(&header, &resp).await;
    });
    match result.expect("FindCoordinator") {
        Response::FindCoordinator(r) => {
            let port = if version >= 4 {
                r.coordinators.first().map(|c| c.port)
            } else {
                Some(r.port)
            };
            assert_eq!(port, Some(9092));
        }
        other => panic!("unexpected {other:?}"),
    }
}

// ---- deadlines owned by the connection ------------------------------------------------------

#[tokio::test(start_paused = true)]
async fn abandoned_requests_expire_in_the_connection() {
    let timeout = Duration::from_secs(1);
    let cfg = ConnConfig::default().with_request_timeout(timeout);
    let (conn, mut peer) = setup_with(cfg, 1 << 20).await;
    let started = tokio::time::Instant::now();
    let n = 100;
    let callers: Vec<_> = (0..n)
        .map(|generation| {
            let conn = conn.clone();
            tokio::spawn(async move { conn.request(heartbeat(generation)).await })
        })
        .collect();
    // Each was written, hence registered, before the peer could read it.
    for _ in 0..n {
        peer.recv().await;
    }
    assert_eq!(conn.in_flight(), n as usize);
    for caller in &callers {
        caller.abort();
    }
    for caller in callers {
        assert!(caller.await.expect_err("aborted").is_cancelled());
    }
    // Nobody waits any more and the peer never answers: only the connection can end this.
    tokio::time::timeout(PROMPTLY, conn.closed())
        .await
        .expect("the connection must expire requests whose callers are gone");
    assert!(
        started.elapsed() >= timeout,
        "expired early: {:?}",
        started.elapsed()
    );
    assert_eq!(conn.in_flight(), 0);
    let later = conn.request(heartbeat(0)).await.expect_err("closed");
    assert!(
        matches!(poisoned_by(&later), Error::Timeout { .. }),
        "{later:?}"
    );
    peer.expect_closed().await;
}

#[tokio::test(start_paused = true)]
async fn each_request_expires_at_its_own_deadline() {
    let timeout = Duration::from_secs(1);
    let cfg = ConnConfig::default().with_request_timeout(timeout);
    let (conn, mut peer) = setup_with(cfg, 64 * 1024).await;
    let long_timeout = Duration::from_secs(60);
    let started = tokio::time::Instant::now();
    let short = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(1)).await }
    });
    let (short_header, _) = peer.recv().await;
    let long = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request_with_timeout(heartbeat(2), long_timeout).await }
    });
    peer.recv().await;
    // Both are in flight, so the expiry task is armed for the short deadline when its answer
    // arrives; that wake-up must not take the long request with it.
    peer.reply(&short_header, &HeartbeatResponse::default())
        .await;
    short.await.expect("task").expect("answered in time");
    let early = tokio::time::timeout(timeout * 5, conn.closed()).await;
    assert!(early.is_err(), "closed at the answered request's deadline");
    assert_eq!(conn.in_flight(), 1);
    let err = tokio::time::timeout(long_timeout + PROMPTLY, long)
        .await
        .expect("the long request must expire")
        .expect("task")
        .expect_err("never answered");
    match err {
        Error::Timeout { after, .. } => assert_eq!(after, long_timeout),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= long_timeout, "{:?}", started.elapsed());
    assert_eq!(conn.in_flight(), 0);
}

#[tokio::test(start_paused = true)]
async fn a_sooner_deadline_registered_after_a_later_one_is_kept() {
    // The expiry task, armed for the long request, is woken only for a request due sooner:
    // the short one's caller is gone, so only that wake-up can end its wait.
    let timeout = Duration::from_secs(1);
    let cfg = ConnConfig::default().with_request_timeout(timeout);
    let (conn, mut peer) = setup_with(cfg, 64 * 1024).await;
    // Past the handshake's deadline (the request timeout), for which the expiry task was armed:
    // it has then woken and found nothing in flight.
    tokio::time::sleep(timeout * 2).await;
    let long_timeout = Duration::from_secs(60);
    let long = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request_with_timeout(heartbeat(1), long_timeout).await }
    });
    peer.recv().await;
    // In paused time a sleep ends only once every task is idle, so the expiry task has armed
    // for the long deadline by then (nothing observable says so: it is internal).
    tokio::time::sleep(Duration::from_millis(1)).await;
    let started = tokio::time::Instant::now();
    let short = tokio::spawn({
        let conn = conn.clone();
        async move { conn.request(heartbeat(2)).await }
    });
    peer.recv().await;
    short.abort();
    assert!(short.await.expect_err("aborted").is_cancelled());
    // Paused time makes the bound exact; a task still armed for the long deadline would close
    // the connection 59 s past it.
    tokio::time::timeout(timeout * 2, conn.closed())
        .await
        .expect("the connection must expire the short request at its own deadline");
    assert!(started.elapsed() >= timeout, "{:?}", started.elapsed());
    let err = long
        .await
        .expect("task")
        .expect_err("the connection failed");
    assert!(
        matches!(poisoned_by(&err), Error::Timeout { .. }),
        "{err:?}"
    );
}

#[tokio::test]
async fn duration_max_timeouts_mean_no_timeout() {
    let cfg = ConnConfig::default()
        .with_connect_timeout(Duration::MAX)
        .with_request_timeout(Duration::MAX);
    let (conn, mut peer) = setup_with(cfg.clone(), 64 * 1024).await;
    let (default, ()) = tokio::join!(conn.request(heartbeat(1)), async {
        let (header, _) = peer.recv().await;
        peer.reply(
            &header,
            &HeartbeatResponse::default().with_throttle_time_ms(1),
        )
        .await;
    });
    assert_eq!(heartbeat_throttle(default.expect("default timeout")), 1);
    let (explicit, ()) = tokio::join!(
        conn.request_with_timeout(heartbeat(2), Duration::MAX),
        async {
            let (header, _) = peer.recv().await;
            peer.reply(
                &header,
                &HeartbeatResponse::default().with_throttle_time_ms(2),
            )
            .await;
        }
    );
    assert_eq!(heartbeat_throttle(explicit.expect("explicit timeout")), 2);
    // Far in the future but still an Instant: a real deadline, which tokio's timer must take.
    let (huge, ()) = tokio::join!(
        conn.request_with_timeout(heartbeat(3), Duration::from_secs(u64::MAX / 4)),
        async {
            let (header, _) = peer.recv().await;
            peer.reply(
                &header,
                &HeartbeatResponse::default().with_throttle_time_ms(3),
            )
            .await;
        }
    );
    assert_eq!(heartbeat_throttle(huge.expect("huge timeout")), 3);
    assert!(!conn.is_closed());

    let brokers = Listeners::start(&[Behaviour::Serve]).await;
    let over_tcp = Connection::connect(&brokers.addrs[0], &cfg)
        .await
        .expect("connect with unbounded timeouts");
    assert!(!over_tcp.is_closed());
}

// ---- dialing --------------------------------------------------------------------------------

/// How long a connect to a listener with room in its queue may take before the queue is taken
/// for full. Loopback connects complete inside the connect call, so this is only reached when
/// the SYN was dropped.
const QUEUE_PROBE: Duration = Duration::from_secs(1);

/// A loopback address that black-holes connection attempts, as a route that drops packets does:
/// a listener that never accepts, with its accept queue full, so the kernel drops further SYNs
/// (no RST) and a connect hangs until the caller gives up. Keep the returned value alive.
async fn black_hole() -> (SocketAddr, (TcpListener, Vec<std::net::TcpStream>)) {
    let socket = TcpSocket::new_v4().expect("socket");
    socket
        .bind(SocketAddr::from(([127, 0, 0, 1], 0)))
        .expect("bind");
    let listener = socket.listen(0).expect("listen");
    let addr = listener.local_addr().expect("addr");
    let fillers = tokio::task::spawn_blocking(move || {
        let mut fillers = Vec::new();
        for _ in 0..16 {
            match std::net::TcpStream::connect_timeout(&addr, QUEUE_PROBE) {
                Ok(stream) => fillers.push(stream),
                // This attempt's SYN was dropped: the hole is real.
                Err(e) if e.kind() == io::ErrorKind::TimedOut => return fillers,
                Err(e) => panic!("filling the black hole's accept queue: {e}"),
            }
        }
        panic!("a listener with backlog 0 kept accepting; cannot make a black hole here");
    })
    .await
    .expect("filler task");
    (addr, (listener, fillers))
}

#[tokio::test]
async fn a_black_holed_first_address_does_not_hide_the_next_one() {
    let (hole, _keep) = black_hole().await;
    let brokers = Listeners::start(&[Behaviour::Serve]).await;
    let live: SocketAddr = brokers.addrs[0].parse().expect("addr");
    // What a dual-stack name whose IPv6 route drops packets looks like: the dead address first.
    let dialer = Dialer::new(move |_| Ok(vec![hole, live]));
    let cfg = ConnConfig::default().with_connect_timeout(Duration::from_secs(5));
    let name = "dual-stack.test:9092";
    let conn = Connection::connect_via(name, &cfg, &dialer)
        .await
        .expect("the live address must be reached within the connect timeout");
    assert_eq!(conn.peer(), name);
    assert_eq!(brokers.take_accepted(), [0]);
    assert_eq!(dialer.preferred_for(name), Some(live));
    // The memory of what worked is used: the next connection goes to the live address too.
    Connection::connect_via(name, &cfg, &dialer)
        .await
        .expect("reconnect");
    assert_eq!(brokers.take_accepted(), [0]);
}

#[test]
fn candidates_alternate_families_and_what_worked_goes_first() {
    let v6 = |port: u16| SocketAddr::from(([0, 0, 0, 0, 0, 0, 0, 1], port));
    let v4 = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
    let resolved = vec![v6(1), v6(2), v6(3), v4(4), v4(5), v6(1)];
    assert_eq!(
        order(resolved.clone(), None),
        [v6(1), v4(4), v6(2), v4(5), v6(3)]
    );
    assert_eq!(
        order(resolved.clone(), Some(v4(5))),
        [v4(5), v6(1), v4(4), v6(2), v6(3)]
    );
    // A remembered address the name no longer resolves to is ignored.
    assert_eq!(order(resolved, Some(v4(9)))[0], v6(1));
    assert_eq!(order(vec![v4(1), v6(2)], None), [v4(1), v6(2)]);
    assert!(order(Vec::new(), Some(v4(1))).is_empty());
}

/// A resolver that blocks until [`Gate::open`], as a system resolver waiting on a DNS server
/// that never answers.
#[derive(Clone, Default)]
struct Gate(Arc<(Mutex<bool>, Condvar)>);

impl Gate {
    fn dialer(&self) -> Dialer {
        let gate = self.clone();
        Dialer::new(move |_| {
            let (open, cv) = &*gate.0;
            let mut open = open.lock().expect("gate");
            while !*open {
                open = cv.wait(open).expect("gate");
            }
            Err(io::Error::other("lookup released by the test"))
        })
    }

    fn open(&self) {
        let (open, cv) = &*self.0;
        *open.lock().expect("gate") = true;
        cv.notify_all();
    }
}

#[test]
fn a_hanging_name_lookup_holds_neither_the_error_nor_the_runtime() {
    let gate = Gate::default();
    let dialer = gate.dialer();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let connect_timeout = Duration::from_millis(300);
    let cfg = ConnConfig::default().with_connect_timeout(connect_timeout);
    let started = std::time::Instant::now();
    let err = runtime
        .block_on(Connection::connect_via("hangs.test:9092", &cfg, &dialer))
        .expect_err("the lookup never answers");
    let took = started.elapsed();
    assert!(
        matches!(&err, Error::Timeout { after, .. } if *after == connect_timeout),
        "{err:?}"
    );
    assert!(took < connect_timeout + PROMPTLY, "reported after {took:?}");
    assert_eq!(dialer.pending_lookups(), 1, "the lookup is still blocked");

    // Dropping the runtime must not wait for the lookup, which is still blocked.
    let (dropped_tx, dropped_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(runtime);
        let _ = dropped_tx.send(());
    });
    let dropped = dropped_rx.recv_timeout(PROMPTLY);
    gate.open();
    assert!(
        dropped.is_ok(),
        "dropping the runtime waited for the abandoned lookup"
    );
}

// On the real clock: a paused one stops advancing while a blocking-pool task runs, which would
// turn a regression to `spawn_blocking` into a hang instead of a failure.
#[tokio::test]
async fn abandoned_lookups_are_bounded() {
    let gate = Gate::default();
    let dialer = gate.dialer();
    let give_up = Duration::from_millis(20);
    for i in 0..MAX_PENDING_LOOKUPS {
        let name = format!("hangs-{i}.test:9092");
        let gave_up = tokio::time::timeout(give_up, dialer.connect(&name, give_up)).await;
        assert!(gave_up.is_err(), "lookup {i} cannot have finished");
    }
    assert_eq!(dialer.pending_lookups(), MAX_PENDING_LOOKUPS);
    let refused = tokio::time::timeout(PROMPTLY, dialer.connect("one-more.test:9092", give_up))
        .await
        .expect("refused at once, not started");
    gate.open();
    match refused {
        Err(Error::Io { source, .. }) => {
            assert_eq!(source.kind(), io::ErrorKind::WouldBlock, "{source}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
}

// ---- bootstrap ------------------------------------------------------------------------------

/// A loopback port with nothing listening on it.
async fn dead_addr() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("addr");
    drop(listener);
    addr.to_string()
}

/// What one of [`Listeners`] does with a connection it accepts.
#[derive(Debug, Clone, Copy)]
enum Behaviour {
    /// Closes it at once: the client's handshake fails.
    Refuse,
    /// Completes the handshake and keeps it open until the client goes away.
    Serve,
}

/// Loopback listeners, one per [`Behaviour`], each logging its index for every connection it
/// accepts, so a test sees which addresses were tried and in what order.
struct Listeners {
    addrs: Vec<String>,
    log: Arc<Mutex<Vec<usize>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Listeners {
    async fn start(behaviours: &[Behaviour]) -> Listeners {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for (index, &behaviour) in behaviours.iter().enumerate() {
            let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
            addrs.push(listener.local_addr().expect("addr").to_string());
            let log = Arc::clone(&log);
            tasks.push(tokio::spawn(async move {
                loop {
                    let Ok((stream, _)) = listener.accept().await else {
                        return;
                    };
                    log.lock().expect("log").push(index);
                    match behaviour {
                        Behaviour::Refuse => drop(stream),
                        Behaviour::Serve => {
                            tokio::spawn(async move {
                                let mut peer = Peer::new(stream);
                                peer.handshake(BROKER_APIS).await;
                                let _ = peer.read_frame().await;
                            });
                        }
                    }
                }
            }));
        }
        Listeners { addrs, log, tasks }
    }

    /// Indices of the listeners that accepted a connection since the last call, in order.
    fn take_accepted(&self) -> Vec<usize> {
        std::mem::take(&mut *self.log.lock().expect("log"))
    }
}

impl Drop for Listeners {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

fn fixed_backoff(draw: f64) -> Backoff {
    Backoff::with_rng(
        Duration::from_millis(1),
        Duration::from_millis(5),
        2.0,
        0.5,
        move || draw,
    )
}

fn quick_conn() -> ConnConfig {
    ConnConfig::default().with_connect_timeout(Duration::from_secs(5))
}

#[tokio::test]
async fn bootstrap_tries_addresses_in_rotation_from_the_drawn_start() {
    use Behaviour::{Refuse, Serve};
    let brokers = Listeners::start(&[Refuse, Refuse, Serve, Refuse]).await;
    // random_index maps a draw d over four entries to floor(4 d).
    for (draw, want) in [
        (0.0, vec![0, 1, 2]),
        (0.3, vec![1, 2]),
        (0.6, vec![2]),
        (0.9, vec![3, 0, 1, 2]),
    ] {
        let mut backoff = fixed_backoff(draw);
        let conn = connect_any(
            &brokers.addrs,
            &quick_conn(),
            &mut backoff,
            &BootstrapConfig::default(),
        )
        .await
        .expect("bootstrap");
        assert_eq!(conn.peer(), brokers.addrs[2]);
        assert_eq!(brokers.take_accepted(), want, "draw {draw}");
        assert_eq!(backoff.attempts(), 0, "no pause within the first round");
    }
}

#[tokio::test]
async fn bootstrap_starts_every_round_at_the_same_address() {
    use Behaviour::Refuse;
    let brokers = Listeners::start(&[Refuse, Refuse, Refuse]).await;
    let mut backoff = fixed_backoff(0.5);
    let err = connect_any(
        &brokers.addrs,
        &quick_conn(),
        &mut backoff,
        &BootstrapConfig::default().with_max_rounds(2),
    )
    .await
    .expect_err("every broker refuses");
    assert!(
        matches!(&err, Error::Bootstrap(e) if e.rounds == 2),
        "{err:?}"
    );
    assert_eq!(brokers.take_accepted(), [1, 2, 0, 1, 2, 0]);
}

type Attempt =
    std::pin::Pin<Box<dyn std::future::Future<Output = crate::error::Result<String>> + Send>>;

/// Scripted bootstrap addresses for [`rotate`] on a paused clock: `hole-*` never answers,
/// `refuse-*` fails at once, `flaky-*` fails the first time it is tried, anything else connects.
/// Each call is logged.
fn scripted(log: &Arc<Mutex<Vec<String>>>) -> impl FnMut(&str) -> Attempt {
    let log = Arc::clone(log);
    move |addr: &str| {
        let tried_before = {
            let mut log = log.lock().expect("log");
            let seen = log.iter().any(|a| a == addr);
            log.push(addr.to_owned());
            seen
        };
        let refuse = addr.starts_with("refuse") || (addr.starts_with("flaky") && !tried_before);
        let hole = addr.starts_with("hole");
        let addr = addr.to_owned();
        Box::pin(async move {
            if hole {
                std::future::pending::<()>().await;
            }
            if refuse {
                return Err(Error::Io {
                    op: "connect to broker",
                    source: io::Error::from(io::ErrorKind::ConnectionRefused),
                });
            }
            Ok(addr)
        })
    }
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(start_paused = true)]
async fn bootstrap_deadline_never_cuts_the_first_round_short() {
    // Three black holes ahead of the live broker, and the deadline lock.rs uses: three connect
    // timeouts, all spent on the holes by the time the live broker's turn comes.
    let connect_timeout = Duration::from_secs(1);
    let list = names(&["hole-a", "hole-b", "hole-c", "live"]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let started = tokio::time::Instant::now();
    let got = rotate(
        &list,
        connect_timeout,
        &mut fixed_backoff(0.0),
        &BootstrapConfig::default()
            .with_deadline(connect_timeout * 3)
            .with_max_rounds(3),
        scripted(&log),
    )
    .await
    .expect("the live broker is reached in the first round");
    assert_eq!(got, "live");
    assert_eq!(*log.lock().expect("log"), list);
    // Each hole had its full connect timeout; none was cut short.
    assert!(
        started.elapsed() >= connect_timeout * 3,
        "{:?}",
        started.elapsed()
    );
}

#[tokio::test(start_paused = true)]
async fn bootstrap_deadline_bounds_the_later_rounds() {
    let connect_timeout = Duration::from_secs(1);
    let deadline = Duration::from_millis(2500);
    let list = names(&["hole"]);
    let log = Arc::new(Mutex::new(Vec::new()));
    let started = tokio::time::Instant::now();
    let err = rotate(
        &list,
        connect_timeout,
        &mut Backoff::with_rng(
            Duration::from_millis(100),
            Duration::from_millis(100),
            2.0,
            0.0,
            || 0.0,
        ),
        &BootstrapConfig::default()
            .with_deadline(deadline)
            .with_max_rounds(100),
        scripted(&log),
    )
    .await
    .expect_err("a black hole never connects");
    // 0-1 s, pause, 1.1-2.1 s, pause, 2.2 s until the deadline cuts the third attempt.
    let elapsed = started.elapsed();
    assert!(
        elapsed >= deadline && elapsed < deadline + connect_timeout,
        "{elapsed:?}"
    );
    let Error::Bootstrap(e) = &err else {
        panic!("expected a bootstrap error, got {err:?}");
    };
    assert_eq!(e.rounds, 3);
    assert_eq!(log.lock().expect("log").len(), 3);
    match &e.attempts[0].error {
        Error::Timeout { op, after } => {
            assert!(op.contains("overall deadline"), "{op}");
            assert!(*after < connect_timeout, "{after:?}");
        }
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test(start_paused = true)]
async fn bootstrap_takes_duration_max_anywhere() {
    let log = Arc::new(Mutex::new(Vec::new()));
    let huge_backoff = || Backoff::with_rng(Duration::MAX, Duration::MAX, 2.0, 0.5, || 0.0);
    // No bound anywhere: the pause is as long as tokio sleeps, then the second round connects.
    let got = rotate(
        &names(&["refuse-a", "flaky-b"]),
        Duration::MAX,
        &mut huge_backoff(),
        &BootstrapConfig::default()
            .with_deadline(Duration::MAX)
            .with_max_rounds(2),
        scripted(&log),
    )
    .await
    .expect("connects in the second round");
    assert_eq!(got, "flaky-b");
    assert_eq!(log.lock().expect("log").len(), 4);
    // A finite deadline with a pause no Instant can hold ends the rounds instead of panicking.
    let err = rotate(
        &names(&["refuse-a"]),
        Duration::MAX,
        &mut huge_backoff(),
        &BootstrapConfig::default()
            .with_deadline(Duration::from_secs(60))
            .with_max_rounds(5),
        scripted(&log),
    )
    .await
    .expect_err("refused");
    assert!(
        matches!(&err, Error::Bootstrap(e) if e.rounds == 1),
        "{err:?}"
    );
}

#[tokio::test]
async fn bootstrap_over_real_sockets_takes_duration_max() {
    use Behaviour::{Refuse, Serve};
    let brokers = Listeners::start(&[Refuse, Serve]).await;
    let cfg = ConnConfig::default()
        .with_connect_timeout(Duration::MAX)
        .with_request_timeout(Duration::MAX);
    let conn = connect_any(
        &brokers.addrs,
        &cfg,
        &mut Backoff::with_rng(Duration::MAX, Duration::MAX, 2.0, 0.5, || 0.0),
        &BootstrapConfig::default().with_deadline(Duration::MAX),
    )
    .await
    .expect("bootstrap");
    assert_eq!(conn.peer(), brokers.addrs[1]);
    assert_eq!(brokers.take_accepted(), [0, 1]);
}

#[tokio::test]
async fn bootstrap_failure_lists_every_address_and_its_error() {
    let a = dead_addr().await;
    let b = dead_addr().await;
    let mut backoff = fixed_backoff(0.5);
    let err = connect_any(
        &[a.clone(), b.clone(), "no-port-here".to_owned()],
        &quick_conn(),
        &mut backoff,
        &BootstrapConfig::default().with_max_rounds(3),
    )
    .await
    .expect_err("nothing is listening");
    let Error::Bootstrap(e) = &err else {
        panic!("expected a bootstrap error, got {err:?}");
    };
    assert_eq!(e.rounds, 3);
    assert_eq!(
        backoff.attempts(),
        2,
        "one pause between each pair of rounds"
    );
    let addrs: Vec<&str> = e.attempts.iter().map(|a| a.addr.as_str()).collect();
    assert_eq!(addrs, [a.as_str(), b.as_str(), "no-port-here"]);
    assert!(matches!(e.attempts[0].error, Error::Io { .. }));
    let text = err.to_string();
    for addr in [&a, &b] {
        assert!(text.contains(addr.as_str()), "{text}");
    }
    assert!(text.contains("no-port-here"), "{text}");
}

#[tokio::test]
async fn bootstrap_respects_the_deadline() {
    // A listener that accepts but never answers ApiVersions.
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let silent = listener.local_addr().expect("addr").to_string();
    let mut backoff = fixed_backoff(0.0);
    let started = tokio::time::Instant::now();
    let err = connect_any(
        std::slice::from_ref(&silent),
        // The first attempt always gets the whole connect timeout; the deadline bounds the rest.
        &ConnConfig::default().with_connect_timeout(Duration::from_millis(200)),
        &mut backoff,
        &BootstrapConfig::default()
            .with_deadline(Duration::from_millis(300))
            .with_max_rounds(100),
    )
    .await
    .expect_err("the broker never answers");
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let Error::Bootstrap(e) = &err else {
        panic!("expected a bootstrap error, got {err:?}");
    };
    assert!(
        matches!(e.attempts[0].error, Error::Timeout { .. }),
        "{err:?}"
    );
    drop(listener);
}

#[tokio::test]
async fn bootstrap_rejects_an_empty_list() {
    let err = connect_any(
        &[],
        &ConnConfig::default(),
        &mut Backoff::default(),
        &BootstrapConfig::default(),
    )
    .await
    .expect_err("empty");
    assert!(matches!(err, Error::Config(_)), "{err:?}");
}

#[test]
fn request_enum_accepts_typed_requests() {
    let r: Request = heartbeat(1).into();
    assert_eq!(r.api_key(), ApiKey::Heartbeat);
}

/// A scripted broker for the pool: accepts connections on loopback, answers each one's
/// ApiVersions, then reports it (the server side) on `accepted`.
pub(super) async fn lane_broker() -> (
    crate::membership::Broker,
    tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let mut peer = Peer::new(socket);
            peer.handshake(BROKER_APIS).await;
            if tx.send(peer).is_err() {
                return;
            }
        }
    });
    let broker = crate::membership::Broker {
        node_id: 1,
        host: "127.0.0.1".into(),
        port: i32::from(port),
    };
    (broker, rx)
}

/// A lock's view of the client's connections: its pool and the stripe of its quick connection.
fn session_on(pool: Arc<pool::Pool>, stripe: usize) -> session::Session {
    session::Session {
        pool,
        private: false,
        join_lane: Default::default(),
        sent: Default::default(),
        stripe,
        join_gate: None,
    }
}

/// Takes the one lane of a session whose pool has a cap of one, so that a first join waits in
/// line for it; with the lane's connection at the broker's end.
async fn take_the_only_lane(
    net: &session::Session,
    broker: &crate::membership::Broker,
    accepted: &mut tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
) -> (pool::Lane, Peer<tokio::net::TcpStream>) {
    let taken = tokio::time::timeout(PROMPTLY, net.pool.lane(broker, pool::Park::Fresh))
        .await
        .expect("a cap of one lane keeps none in reserve")
        .unwrap();
    let server = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a connection for the lane")
        .unwrap();
    (taken, server)
}

/// A member's first JoinGroup to `broker`, on the join lane.
fn first_join(
    broker: &crate::membership::Broker,
    timeout: Duration,
) -> crate::membership::Transmit {
    use crate::membership::{Lane, Target, Transmit};
    Transmit {
        id: 1,
        target: Target::Coordinator {
            broker: broker.clone(),
            lane: Lane::Join,
        },
        request: kafka_protocol::messages::JoinGroupRequest::default().into(),
        version: 5,
        timeout,
    }
}

fn lane_pool(cap: usize) -> Arc<pool::Pool> {
    striped_pool(cap, 1)
}

fn striped_pool(cap: usize, quick_connections: usize) -> Arc<pool::Pool> {
    Arc::new(pool::Pool::new(pool_config(cap, quick_connections)))
}

fn pool_config(cap: usize, quick_connections: usize) -> pool::PoolConfig {
    pool::PoolConfig {
        bootstrap: vec![],
        conn: ConnConfig::default(),
        limits: BootstrapConfig::default(),
        retry_backoff: Duration::from_millis(10),
        retry_backoff_max: Duration::from_millis(100),
        parking_lanes: cap,
        quick_connections,
        acquisitions_at_once: 0,
    }
}

/// First joins and polls take at most `cap - cap/4` lanes; what a membership in force needs
/// still gets one when they are all taken, and a fresh request waits until one comes back.
#[tokio::test]
async fn fresh_requests_leave_the_reserve_lanes_to_urgent_ones() {
    use pool::Park;
    let (broker, mut accepted) = lane_broker().await;
    let pool = lane_pool(4);
    let mut fresh = Vec::new();
    for _ in 0..3 {
        fresh.push(
            tokio::time::timeout(PROMPTLY, pool.lane(&broker, Park::Fresh))
                .await
                .expect("a free lane is lent at once")
                .unwrap(),
        );
    }
    let urgent = tokio::time::timeout(PROMPTLY, pool.lane(&broker, Park::Urgent))
        .await
        .expect("the reserve lane is lent while the fresh ones are taken")
        .unwrap();
    let mut waiting = tokio::spawn({
        let (pool, broker) = (pool.clone(), broker.clone());
        async move { pool.lane(&broker, Park::Fresh).await.map(|l| l.done()) }
    });
    // Four connections, one per lane lent (kept open on the broker's side).
    let mut servers = Vec::new();
    for _ in 0..4 {
        servers.push(
            tokio::time::timeout(PROMPTLY, accepted.recv())
                .await
                .expect("a connection per lane")
                .unwrap(),
        );
    }
    // The fourth fresh request has no lane while three fresh ones are out (the urgent one
    // coming back does not help it).
    urgent.done();
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut waiting)
            .await
            .is_err(),
        "a fourth fresh request took the reserve lane"
    );
    fresh.pop().unwrap().done();
    tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("a returned lane serves the waiting request")
        .unwrap()
        .unwrap();
    // Returned lanes were reused: nothing new was dialled.
    assert!(accepted.try_recv().is_err());
    drop(servers);
}

/// A lane whose request was abandoned may still get its answer: it is closed, not lent again.
#[tokio::test]
async fn a_lane_dropped_before_its_answer_is_closed_not_reused() {
    use pool::Park;
    let (broker, mut accepted) = lane_broker().await;
    let pool = lane_pool(4);
    let lane = pool.lane(&broker, Park::Urgent).await.unwrap();
    let mut server = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .unwrap()
        .unwrap();
    let conn = lane.conn().clone();
    let asked = tokio::spawn(async move { conn.request(heartbeat(1)).await });
    let _ = server.recv().await;
    drop(lane);
    server.expect_closed().await;
    assert!(asked.await.unwrap().is_err());
    // The next request gets a new connection.
    let next = pool.lane(&broker, Park::Urgent).await.unwrap();
    tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a fresh connection for the next lane")
        .unwrap();
    next.done();
}

/// A rejoin's lane taken at once (`Pool::idle_lane`) is only one whose last request was
/// answered, and it counts as one of the cap's lanes until its answer is in. Apache serves a
/// connection's requests one at a time (SocketServer.scala's Processor mutes a channel while
/// one of its requests is handled), so a JoinGroup lent a connection whose abandoned long poll is still parked would wait
/// behind it, past the rebalance; and a rejoin lent an idle lane beyond the cap would leave a
/// long poll free to dial another. Breaks if a lane dropped unanswered went back to the idle
/// ones (`Lane`'s drop keeping the connection), or if `idle_lane` lent without a permit (the
/// long poll below gets a lane at once, on a new connection).
#[tokio::test]
async fn a_rejoin_takes_only_an_answered_idle_lane_and_holds_it_within_the_cap() {
    use pool::Park;
    let (broker, mut accepted) = lane_broker().await;
    let pool = lane_pool(1);
    assert!(
        pool.idle_lane(&broker).is_none(),
        "no lane was ever lent to this broker"
    );
    // A long poll given up before its answer: its connection is not lent to the rejoin.
    let poll = pool.lane(&broker, Park::Fresh).await.unwrap();
    let mut parked = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a connection for the long poll")
        .unwrap();
    let conn = poll.conn().clone();
    let asked = tokio::spawn(async move { conn.request(heartbeat(1)).await });
    let _ = parked.recv().await;
    drop(poll);
    assert!(
        pool.idle_lane(&broker).is_none(),
        "a rejoin was lent the connection of an abandoned request"
    );
    parked.expect_closed().await;
    assert!(asked.await.unwrap().is_err());
    // An answered long poll's lane is lent at once, on its own connection.
    let poll = pool.lane(&broker, Park::Fresh).await.unwrap();
    let _server = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a connection for the next long poll")
        .unwrap();
    poll.done();
    let rejoin = pool
        .idle_lane(&broker)
        .expect("the answered long poll's lane, at once");
    // It is the cap's only lane: the re-armed long poll waits for it.
    let mut again = tokio::spawn({
        let (pool, broker) = (pool.clone(), broker.clone());
        async move { pool.lane(&broker, Park::Fresh).await.map(|l| l.done()) }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut again)
            .await
            .is_err(),
        "the long poll got a lane while the rejoin held the cap's only one"
    );
    rejoin.done();
    tokio::time::timeout(PROMPTLY, again)
        .await
        .expect("the rejoin's lane, given back, serves the long poll")
        .unwrap()
        .unwrap();
    assert!(
        accepted.try_recv().is_err(),
        "a connection was dialled though the rejoin's lane went back"
    );
}

/// Apache schedules a classic Heartbeat as a coordinator write bounded by
/// `offsets.commit.timeout.ms` (GroupCoordinatorService.heartbeat, `scheduleWriteOperation(
/// "classic-group-heartbeat", ..., config.offsetCommitTimeoutMs())`), deferred while the group's
/// offsets partition has uncommitted writes, and answers it at that bound at the latest; its
/// muted channel holds every later request on the connection meanwhile. Lock A's heartbeat is
/// held that way; lock B's, behind it on the client's shared quick connection, must get its
/// answer once the broker answers A's. A's local timeout (the request timeout, counted from
/// when it was queued, so it fires before the broker's bound) may report A's request as timed
/// out, but must not close the shared connection under B's.
#[tokio::test]
async fn one_locks_held_heartbeat_timing_out_does_not_fail_anothers_on_the_quick_connection() {
    use crate::membership::{Lane, Target, Transmit};
    let (broker, mut accepted) = lane_broker().await;
    let net = session_on(lane_pool(4), 0);
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let request_timeout = Duration::from_millis(600);
    let heartbeat_of = |id: u64| Transmit {
        id,
        target: Target::Coordinator {
            broker: broker.clone(),
            lane: Lane::Control,
        },
        request: heartbeat(1).into(),
        version: 4,
        timeout: request_timeout,
    };
    session::send_on_task(
        &net,
        heartbeat_of(1),
        pool::Park::Urgent,
        answers_tx.clone(),
    );
    let mut server = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("the quick connection is opened")
        .unwrap();
    let (a, _) = server.recv().await;
    let held_since = tokio::time::Instant::now();
    // B's turn to heartbeat comes while A's is held (within A's request timeout).
    tokio::time::sleep_until(held_since + request_timeout / 2).await;
    session::send_on_task(
        &net,
        heartbeat_of(2),
        pool::Park::Urgent,
        answers_tx.clone(),
    );
    let (b, _) = server.recv().await;
    // The broker answers A's at its own bound, just after A's local timeout (the broker's clock
    // starts when it has read the request), then B's at once, in order.
    tokio::time::sleep_until(held_since + request_timeout + Duration::from_millis(150)).await;
    let open = server
        .reply_if_open(&a, &HeartbeatResponse::default())
        .await
        && server
            .reply_if_open(&b, &HeartbeatResponse::default())
            .await;
    assert!(
        open,
        "A's local timeout closed the shared connection under B's heartbeat"
    );
    let mut got = std::collections::HashMap::new();
    while got.len() < 2 {
        let (_, id, result) = tokio::time::timeout(PROMPTLY, answers.recv())
            .await
            .expect("every request is answered or failed")
            .map(|answer| *answer)
            .unwrap();
        got.insert(id, result);
    }
    assert!(
        got[&2].is_ok(),
        "B's heartbeat failed with A's timeout: {:?}",
        got[&2].as_ref().err()
    );
    // A's retry goes on a fresh connection (the old one might have been dead, not held).
    session::send_on_task(
        &net,
        heartbeat_of(3),
        pool::Park::Urgent,
        answers_tx.clone(),
    );
    let mut fresh = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a fresh quick connection after a timeout")
        .unwrap();
    let (c, _) = fresh.recv().await;
    fresh.reply(&c, &HeartbeatResponse::default()).await;
    let (_, id, result) = tokio::time::timeout(PROMPTLY, answers.recv())
        .await
        .expect("the retry is answered")
        .map(|answer| *answer)
        .unwrap();
    assert_eq!(id, 3);
    result.expect("the retry is answered on the fresh connection");
}

/// The session task polls its control requests itself: an answer to a later one is taken
/// while an earlier one waits, and a request still out when the session ends finishes on its
/// own (a LeaveGroup for a member id given up just before the end is still sent).
#[tokio::test]
async fn control_requests_are_answered_in_any_order_and_outlive_the_session() {
    let mut control = session::Control::default();
    let (first_go, first_wait) = tokio::sync::oneshot::channel::<()>();
    let (first_done, first_finished) = tokio::sync::oneshot::channel::<()>();
    let (second_go, second_wait) = tokio::sync::oneshot::channel::<()>();
    control.push(Box::pin(async move {
        let _ = first_wait.await;
        let _ = first_done.send(());
        (1, Err(Error::Closed))
    }));
    control.push(Box::pin(async move {
        let _ = second_wait.await;
        (2, Err(Error::Closed))
    }));
    second_go.send(()).unwrap();
    let (id, _) = tokio::time::timeout(PROMPTLY, control.next())
        .await
        .expect("the second request's answer is taken while the first waits");
    assert_eq!(id, 2);
    control.detach();
    first_go.send(()).unwrap();
    tokio::time::timeout(PROMPTLY, first_finished)
        .await
        .expect("the request left out finishes")
        .expect("the request left out was dropped, not finished");
}

/// The membership's deferrable timers (its next Heartbeat) are rounded up to the client's grid,
/// so its locks' Heartbeats go out together; the lease's end and the ledger's deadlines are
/// not, no timer is moved past the lease's end, and a timer already due is not delayed.
#[test]
fn deferrable_timers_round_up_to_the_grid_and_the_lease_end_never_moves() {
    use session::{wake_at, TIMER_GRID};
    let origin = std::time::Instant::now();
    let ms = |n: u64| origin + Duration::from_millis(n);
    let grid = u64::try_from(TIMER_GRID.as_millis()).unwrap();
    let now = ms(1);
    // Between two points of the grid: the next one.
    assert_eq!(
        wake_at(Some(ms(grid + 3)), None, None, now, origin),
        Some(ms(2 * grid))
    );
    // On a point: as it is.
    assert_eq!(
        wake_at(Some(ms(2 * grid)), None, None, now, origin),
        Some(ms(2 * grid))
    );
    // Never past the lease's end, nor the lease's end itself moved.
    assert_eq!(
        wake_at(Some(ms(grid + 3)), Some(ms(grid + 5)), None, now, origin),
        Some(ms(grid + 5))
    );
    assert_eq!(
        wake_at(Some(ms(grid + 5)), Some(ms(grid + 5)), None, now, origin),
        Some(ms(grid + 5))
    );
    // Already due (a Heartbeat asked for at once): now.
    assert_eq!(wake_at(Some(now), None, None, now, origin), Some(now));
    // The ledger's deadline stands.
    assert_eq!(
        wake_at(Some(ms(grid + 3)), None, Some(ms(grid + 4)), now, origin),
        Some(ms(grid + 4))
    );
    assert_eq!(wake_at(None, None, None, now, origin), None);
}

/// With every lane taken, an urgent request (a rejoin of a membership in force) does not wait:
/// it gets a lane beyond the cap, closed once its answer is in.
#[tokio::test]
async fn an_urgent_request_gets_an_overflow_lane_when_every_lane_is_taken() {
    use pool::Park;
    let (broker, mut accepted) = lane_broker().await;
    let pool = lane_pool(1);
    // One lane and no reserve: the fresh request takes it.
    let fresh = tokio::time::timeout(PROMPTLY, pool.lane(&broker, Park::Fresh))
        .await
        .expect("a cap of one lane keeps none in reserve")
        .unwrap();
    let urgent = tokio::time::timeout(PROMPTLY, pool.lane(&broker, Park::Urgent))
        .await
        .expect("an urgent request never waits for a lane")
        .unwrap();
    let _first = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a connection for the fresh lane")
        .unwrap();
    let mut overflow = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("a connection for the overflow lane")
        .unwrap();
    urgent.done();
    overflow.expect_closed().await;
    fresh.done();
}

/// A first join waiting for a lane when its session ends leaves the line: it neither takes the
/// next lane nor dials a connection for a member that is gone.
#[tokio::test]
async fn a_first_join_waiting_for_a_lane_leaves_the_line_with_its_session() {
    let (broker, mut accepted) = lane_broker().await;
    let net = session_on(lane_pool(1), 0);
    let (taken, _server) = take_the_only_lane(&net, &broker, &mut accepted).await;
    let (answers_tx, answers) = tokio::sync::mpsc::unbounded_channel();
    let join = first_join(&broker, Duration::from_secs(1));
    session::send_on_task(&net, join, pool::Park::Fresh, answers_tx);
    // The quick connection dialled ahead for the member's first Heartbeat.
    let _quick = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("the quick connection is opened ahead")
        .unwrap();
    drop(answers);
    // The lane comes back closed: a waiter still in line would dial a new one.
    drop(taken);
    assert!(
        tokio::time::timeout(Duration::from_millis(300), accepted.recv())
            .await
            .is_err(),
        "a connection was dialled for a join whose session had ended"
    );
    let fresh = tokio::time::timeout(PROMPTLY, net.pool.lane(&broker, pool::Park::Fresh))
        .await
        .expect("the lane is free for a live request")
        .unwrap();
    fresh.done();
}

/// The session drops its answer channel when idle, so that a held lock keeps none, but never
/// with a request out: a first join waiting in line for a lane holds a sender, and the channel
/// dropped under it would read as its session's end, take it out of the line and lose its answer
/// (no acquisition would complete).
#[tokio::test]
async fn the_answer_channel_stays_while_a_join_waits_for_a_lane_and_carries_its_answer() {
    use kafka_protocol::messages::JoinGroupResponse;
    let (broker, mut accepted) = lane_broker().await;
    let net = session_on(lane_pool(1), 0);
    let (taken, mut server) = take_the_only_lane(&net, &broker, &mut accepted).await;
    let mut answers = None;
    let join = first_join(&broker, Duration::from_secs(5));
    let control = session::send(&net, join, pool::Park::Fresh, || {
        session::answer_to(&mut answers)
    });
    assert!(control.is_none(), "a JoinGroup runs on a task of its own");
    // The quick connection dialled ahead for the member's first Heartbeat: the join's task has
    // been spawned, and waits in line for the lane.
    let _quick = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("the quick connection is opened ahead")
        .unwrap();
    session::drop_idle_answers(&mut answers);
    assert!(
        answers.is_some(),
        "the answer channel was dropped with a join still out"
    );
    // The lane is given back open: the join takes it and goes out on it.
    taken.done();
    let (header, _) = tokio::time::timeout(PROMPTLY, server.recv())
        .await
        .expect("the join went out on the lane given back");
    server.reply(&header, &JoinGroupResponse::default()).await;
    let (source, id, result) = tokio::time::timeout(PROMPTLY, session::next_answer(&mut answers))
        .await
        .expect("the join's answer never came")
        .map(|answer| *answer)
        .expect("the answer channel ended");
    assert_eq!(source, session::Source::Member);
    assert_eq!(id, 1);
    assert!(result.is_ok(), "{:?}", result.err());
}

/// An answer already queued keeps the channel though no request is out any more; with nothing
/// out and nothing queued the channel goes, or every held lock would keep one (BENCHMARKS.md,
/// "Memory per held lock").
#[tokio::test]
async fn the_answer_channel_stays_while_an_answer_is_queued_and_goes_once_idle() {
    let mut answers = None;
    let tx = session::answer_to(&mut answers);
    tx.send(Box::new((session::Source::Member, 7, Err(Error::Closed))))
        .unwrap();
    drop(tx);
    session::drop_idle_answers(&mut answers);
    assert!(answers.is_some(), "dropped with an answer queued");
    let (_, id, _) = *tokio::time::timeout(PROMPTLY, session::next_answer(&mut answers))
        .await
        .expect("the queued answer never came")
        .expect("the answer channel ended");
    assert_eq!(id, 7);
    session::drop_idle_answers(&mut answers);
    assert!(answers.is_none(), "an idle answer channel was kept");
}

/// A group's stripe follows Apache's coordinator partition for the default 50 partitions,
/// `Utils.abs(groupId.hashCode()) % 50` (Java's String.hashCode; Utils.abs maps
/// Integer.MIN_VALUE to 0).
#[test]
fn a_groups_quick_connection_stripe_follows_its_offsets_partition() {
    let pool = striped_pool(4, 4);
    // "hello".hashCode() = 99162322: partition 22.
    assert_eq!(pool.stripe("hello"), 22 % 4);
    // "polygenelubricants".hashCode() = Integer.MIN_VALUE: partition 0.
    assert_eq!(pool.stripe("polygenelubricants"), 0);
    // "zz".hashCode() = 122 * 31 + 122 = 3904: partition 4.
    assert_eq!(pool.stripe("zz"), 0);
    assert_eq!(striped_pool(4, 3).stripe("zz"), 4 % 3);
    assert_eq!(striped_pool(4, 1).stripe("hello"), 0);
}

/// Locks on different stripes of one broker use different quick connections: a Heartbeat the
/// broker holds (a deferred coordinator write) does not hold another stripe's.
#[tokio::test]
async fn a_held_heartbeat_holds_back_only_its_own_stripe() {
    use crate::membership::{Lane, Target, Transmit};
    let (broker, mut accepted) = lane_broker().await;
    let pool = striped_pool(4, 2);
    let session = |stripe| session_on(pool.clone(), stripe);
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    let heartbeat_of = |id: u64| Transmit {
        id,
        target: Target::Coordinator {
            broker: broker.clone(),
            lane: Lane::Control,
        },
        request: heartbeat(1).into(),
        version: 4,
        timeout: Duration::from_secs(5),
    };
    session::send_on_task(
        &session(0),
        heartbeat_of(1),
        pool::Park::Urgent,
        answers_tx.clone(),
    );
    let mut first = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("the quick connection of stripe 0 is opened")
        .unwrap();
    let (held, _) = first.recv().await;
    session::send_on_task(
        &session(1),
        heartbeat_of(2),
        pool::Park::Urgent,
        answers_tx.clone(),
    );
    let mut second = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("stripe 1 has a quick connection of its own, not queued behind the held one")
        .unwrap();
    let (b, _) = second.recv().await;
    second.reply(&b, &HeartbeatResponse::default()).await;
    let (_, id, result) = tokio::time::timeout(PROMPTLY, answers.recv())
        .await
        .expect("stripe 1's heartbeat is answered while stripe 0's is held")
        .map(|answer| *answer)
        .unwrap();
    assert_eq!(id, 2);
    result.expect("stripe 1's heartbeat");
    first.reply(&held, &HeartbeatResponse::default()).await;
}

/// What the SASL broker below advertises: the usual APIs plus the SASL ones.
fn sasl_apis() -> Vec<(ApiKey, i16, i16)> {
    let mut apis = BROKER_APIS.to_vec();
    apis.push((ApiKey::SaslHandshake, 0, 1));
    apis.push((ApiKey::SaslAuthenticate, 0, 2));
    apis
}

impl<S: AsyncRead + AsyncWrite + Unpin> Peer<S> {
    /// ApiVersions, then a PLAIN exchange whose session lasts `lifetime` (KIP-368).
    async fn authenticate(&mut self, lifetime: Duration) {
        use kafka_protocol::messages::{
            SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
            SaslHandshakeResponse,
        };
        self.handshake(&sasl_apis()).await;
        let (header, req) = self
            .recv_as::<SaslHandshakeRequest>(ApiKey::SaslHandshake)
            .await;
        assert_eq!(req.mechanism.as_str(), "PLAIN");
        let resp = SaslHandshakeResponse::default()
            .with_mechanisms(vec![StrBytes::from_static_str("PLAIN")]);
        self.reply(&header, &resp).await;
        let (header, _) = self
            .recv_as::<SaslAuthenticateRequest>(ApiKey::SaslAuthenticate)
            .await;
        let resp = SaslAuthenticateResponse::default()
            .with_session_lifetime_ms(lifetime.as_millis() as i64);
        self.reply(&header, &resp).await;
    }
}

/// A request in flight on a link that a KIP-368 renewal has replaced still belongs to the
/// connection: `close()` ends it (with `Closed`, as its docs say) and closes that socket, instead
/// of leaving it to wait there for an answer or its own timeout.
#[tokio::test]
async fn close_ends_requests_in_flight_on_a_link_a_renewal_replaced() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    // Short, so the renewal (at 85-95 % of it) comes soon; nothing here depends on when.
    let lifetime = Duration::from_millis(500);
    let broker = tokio::spawn(async move {
        let mut first = Peer::new(listener.accept().await.unwrap().0);
        first.authenticate(lifetime).await;
        first.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        // Left unanswered: the heartbeat stays in flight on the first link.
        let accepted = tokio::time::timeout(PROMPTLY, listener.accept())
            .await
            .expect("no renewal came")
            .unwrap();
        let mut second = Peer::new(accepted.0);
        // A long lifetime now, so no further renewal runs during the test.
        second.authenticate(Duration::from_secs(3600)).await;
        (first, second)
    });
    let cfg = ConnConfig::default().with_security(
        crate::security::Security::new(crate::security::SecurityProtocol::SaslPlaintext)
            .with_sasl(crate::security::Sasl::plain("user", "secret".into())),
    );
    let conn = Connection::connect(&addr, &cfg).await.expect("connect");
    let held = tokio::spawn({
        let conn = conn.clone();
        // Far beyond the test's own bounds: only close() can end it in time.
        async move {
            conn.request_with_timeout(heartbeat(1), Duration::from_secs(3600))
                .await
        }
    });
    tokio::time::timeout(PROMPTLY, conn.renewed(1))
        .await
        .expect("the renewal did not swap a fresh link in");
    let (mut first, mut second) = broker.await.expect("scripted broker");
    assert!(
        !held.is_finished(),
        "the held heartbeat ended before close()"
    );

    conn.close();
    let err = tokio::time::timeout(PROMPTLY, held)
        .await
        .expect("close() left the request on the replaced link in flight")
        .expect("task")
        .expect_err("closed");
    assert!(matches!(err, Error::Closed), "{err:?}");
    first.expect_closed().await;
    second.expect_closed().await;
    assert!(conn.is_closed());
}

/// Like [`lane_broker`], advertising `apis`; also returns the address.
async fn broker_with(
    apis: &'static [(ApiKey, i16, i16)],
) -> (
    crate::membership::Broker,
    tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let mut peer = Peer::new(socket);
            peer.handshake(apis).await;
            if tx.send(peer).is_err() {
                return;
            }
        }
    });
    let broker = crate::membership::Broker {
        node_id: 1,
        host: "127.0.0.1".into(),
        port: i32::from(port),
    };
    (broker, rx)
}

async fn next_peer(
    accepted: &mut tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
) -> Peer<tokio::net::TcpStream> {
    tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("no connection came")
        .expect("listener gone")
}

/// A description made through a client's connections opens none of its own: FindCoordinator
/// goes on the client's bootstrap connection, DescribeGroups on the coordinator's quick
/// connection, and both stay open for the client's locks after the description is done. A
/// second description costs two requests and no connection.
#[tokio::test]
async fn descriptions_through_a_client_share_its_quick_connections() {
    use kafka_protocol::messages::describe_groups_response::DescribedGroup;
    use kafka_protocol::messages::DescribeGroupsResponse;
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let coordinator =
        FindCoordinatorResponse::default().with_coordinators(vec![Coordinator::default()
            .with_key(StrBytes::from_static_str("g"))
            .with_node_id(BrokerId(broker.node_id))
            .with_host(StrBytes::from_string(broker.host.clone()))
            .with_port(broker.port)]);
    let empty = DescribeGroupsResponse::default().with_groups(vec![DescribedGroup::default()
        .with_group_id(StrBytes::from_static_str("g").into())
        .with_group_state(StrBytes::from_static_str("Empty"))]);
    let mut boot = None;
    let mut coord = None;
    for _ in 0..2 {
        let lock = client.lock("g");
        let script = async {
            if boot.is_none() {
                boot = Some(next_peer(&mut accepted).await);
            }
            let b = boot.as_mut().expect("bootstrap peer");
            let (h, _) = b
                .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
                .await;
            b.reply(&h, &coordinator).await;
            if coord.is_none() {
                coord = Some(next_peer(&mut accepted).await);
            }
            let c = coord.as_mut().expect("coordinator peer");
            let (h, _) = c
                .recv_as::<DescribeGroupsRequest>(ApiKey::DescribeGroups)
                .await;
            c.reply(&h, &empty).await;
        };
        let (described, ()) = tokio::join!(lock.describe(), script);
        let d = described.expect("described");
        assert_eq!(d.state, crate::group_view::LockState::Free);
    }
    assert!(
        accepted.try_recv().is_err(),
        "a description opened a connection of its own"
    );
    // Still open for the client's locks: a Heartbeat of group g takes the same connection.
    let mut coord = coord.expect("coordinator peer");
    let conn = pool.quick(Some(&broker), pool.stripe("g")).await.unwrap();
    let (hb, ()) = tokio::join!(conn.request(heartbeat(1)), async {
        let (h, _) = coord.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        coord.reply(&h, &HeartbeatResponse::default()).await;
    });
    hb.expect("heartbeat on the coordinator's quick connection");
    assert!(accepted.try_recv().is_err());
}

/// [`BROKER_APIS`] and what a ledger reader needs (no DescribeConfigs: the compression check is
/// then skipped).
const LEDGER_APIS: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::OffsetCommit, 0, 9),
    (ApiKey::OffsetFetch, 0, 9),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::Produce, 0, 9),
    (ApiKey::Fetch, 0, 12),
    (ApiKey::ListOffsets, 0, 7),
];

/// An observer's long-poll Fetch of the ledger, through a client, takes a parking lane: the
/// broker parks it for up to its wait, and the Heartbeats of the client's locks on the leader's
/// quick connection are answered meanwhile.
#[tokio::test]
async fn a_ledger_long_poll_through_a_client_parks_on_a_lane_not_the_quick_connection() {
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{FetchRequest, FetchResponse};
    let (broker, mut accepted) = broker_with(LEDGER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let lock = client.lock("g").ledger_topic("ledger");
    let mut tail = ledger::LedgerTail::new(lock.reach(), "g", "ledger", Some(0));
    let poll = tokio::spawn(async move { tail.poll(Duration::from_secs(3600)).await });

    let mut boot = next_peer(&mut accepted).await;
    let (h, _) = boot.recv_as::<MetadataRequest>(ApiKey::Metadata).await;
    let metadata = MetadataResponse::default()
        .with_brokers(vec![MetadataResponseBroker::default()
            .with_node_id(BrokerId(broker.node_id))
            .with_host(StrBytes::from_string(broker.host.clone()))
            .with_port(broker.port)])
        .with_topics(vec![MetadataResponseTopic::default()
            .with_name(Some(TopicName(StrBytes::from_static_str("ledger"))))
            .with_partitions(vec![MetadataResponsePartition::default()
                .with_partition_index(0)
                .with_leader_id(BrokerId(broker.node_id))])]);
    boot.reply(&h, &metadata).await;

    let mut lane = next_peer(&mut accepted).await;
    let (fetch, _) = lane.recv_as::<FetchRequest>(ApiKey::Fetch).await;
    // The Fetch is parked; a lock's Heartbeat to the same broker goes on meanwhile.
    let conn = pool.quick(Some(&broker), pool.stripe("g")).await.unwrap();
    let (hb, ()) = tokio::join!(conn.request(heartbeat(1)), async {
        let mut quick = next_peer(&mut accepted).await;
        let (h, _) = quick.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        quick.reply(&h, &HeartbeatResponse::default()).await;
    });
    hb.expect("heartbeat answered while the Fetch is parked");
    assert!(!poll.is_finished());

    let answer = FetchResponse::default().with_responses(vec![FetchableTopicResponse::default()
        .with_topic(TopicName(StrBytes::from_static_str("ledger")))
        .with_partitions(vec![PartitionData::default().with_partition_index(0)])]);
    lane.reply(&fetch, &answer).await;
    let records = tokio::time::timeout(PROMPTLY, poll)
        .await
        .expect("the poll did not end with its answer")
        .expect("task")
        .expect("poll");
    assert!(records.is_empty());
}

/// Encodes the body of the answer to a request, from its header and body as sent.
type Answer = Arc<dyn Fn(&RequestHeader, Bytes) -> BytesMut + Send + Sync>;

/// Serves every connection `accepted` brings with `answer` until the client closes it.
fn serve_all(
    mut accepted: tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
    answer: Answer,
) -> JoinHandle<()> {
    tokio::spawn(async move {
        while let Some(mut peer) = accepted.recv().await {
            let answer = answer.clone();
            tokio::spawn(async move {
                while let Some(mut frame) = peer.read_frame().await {
                    let header =
                        decode_request_header_from_buffer(&mut frame).expect("bad request header");
                    let body = answer(&header, frame);
                    let api = ApiKey::try_from(header.request_api_key).expect("known API key");
                    let version = header.request_api_version;
                    let mut payload = BytesMut::new();
                    ResponseHeader::default()
                        .with_correlation_id(header.correlation_id)
                        .encode(&mut payload, api.response_header_version(version))
                        .expect("encode response header");
                    payload.put_slice(&body);
                    let mut out = BytesMut::new();
                    out.put_i32(payload.len() as i32);
                    out.put_slice(&payload);
                    peer.send_raw(&out).await;
                }
            });
        }
    })
}

/// An observer's tail of the ledger hands back this lock's records from the offset it is at
/// (not those of its batch before it, nor another lock's), each decoded or with why it could
/// not be; after OFFSET_OUT_OF_RANGE it goes on from the end (a ListOffsets), after any other
/// failure from where it was, both after looking the leader up again. Breaks if the tail
/// kept records by another key or before its offset, or chose where to go on by another code.
#[tokio::test]
async fn a_ledger_tail_hands_back_this_locks_records_and_goes_on_as_the_fetch_failure_says() {
    use crate::ledger::{LedgerRecord, RecordKind};
    use crate::wire::records::{encode_batch, NewRecord};
    use kafka_protocol::messages::fetch_response::{FetchableTopicResponse, PartitionData};
    use kafka_protocol::messages::list_offsets_response::{
        ListOffsetsPartitionResponse, ListOffsetsTopicResponse,
    };
    use kafka_protocol::messages::metadata_response::{
        MetadataResponseBroker, MetadataResponsePartition, MetadataResponseTopic,
    };
    use kafka_protocol::messages::{FetchRequest, FetchResponse, ListOffsetsResponse};
    let acquired = LedgerRecord {
        unix_ms: 1_800_000_000_000,
        hold: -1,
        generation: 1,
        member_id: "m-1".into(),
        label: None,
        host: None,
        pid: None,
        slot: 0,
        kind: RecordKind::Acquired { lease_ms: 5000 },
    };
    let record = |key: &'static str, value: Bytes| NewRecord {
        timestamp: 1_800_000_000_000,
        key: Some(Bytes::from_static(key.as_bytes())),
        value: Some(value),
        headers: Vec::new(),
    };
    // Offsets 3 to 7: two of this lock's before the tail's offset (5), then its ACQUIRED,
    // another lock's record, and one of its own that does not decode.
    let mut batch = BytesMut::new();
    encode_batch(
        &[
            record("g", acquired.encode()),
            record("g", acquired.encode()),
            record("g", acquired.encode()),
            record("other", acquired.encode()),
            record("g", Bytes::from_static(b"\xff")),
        ],
        &mut batch,
    )
    .expect("encode");
    batch[..8].copy_from_slice(&3i64.to_be_bytes());
    let batch = batch.freeze();

    let (broker, accepted) = broker_with(LEDGER_APIS).await;
    // What each Fetch and ListOffsets asked, and how many Metadata lookups were made.
    let fetched: Arc<Mutex<Vec<i64>>> = Arc::default();
    let lookups = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let lists = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let (f, m, l) = (fetched.clone(), lookups.clone(), lists.clone());
    let b = broker.clone();
    let _server = serve_all(
        accepted,
        Arc::new(move |h, mut body| {
            use std::sync::atomic::Ordering::SeqCst;
            let v = h.request_api_version;
            let mut out = BytesMut::new();
            match ApiKey::try_from(h.request_api_key).expect("known API key") {
                ApiKey::Metadata => {
                    m.fetch_add(1, SeqCst);
                    MetadataResponse::default()
                        .with_brokers(vec![MetadataResponseBroker::default()
                            .with_node_id(BrokerId(b.node_id))
                            .with_host(StrBytes::from_string(b.host.clone()))
                            .with_port(b.port)])
                        .with_topics(vec![MetadataResponseTopic::default()
                            .with_name(Some(TopicName(StrBytes::from_static_str("ledger"))))
                            .with_partitions(vec![MetadataResponsePartition::default()
                                .with_partition_index(0)
                                .with_leader_id(BrokerId(b.node_id))])])
                        .encode(&mut out, v)
                }
                ApiKey::ListOffsets => {
                    // The end moves on between the two lists: 20, then 30.
                    let end = if l.fetch_add(1, SeqCst) == 0 { 20 } else { 30 };
                    ListOffsetsResponse::default()
                        .with_topics(vec![ListOffsetsTopicResponse::default()
                            .with_name(TopicName(StrBytes::from_static_str("ledger")))
                            .with_partitions(vec![ListOffsetsPartitionResponse::default()
                                .with_partition_index(0)
                                .with_offset(end)])])
                        .encode(&mut out, v)
                }
                ApiKey::Fetch => {
                    let req = FetchRequest::decode(&mut body, v).expect("Fetch");
                    let at = req.topics[0].partitions[0].fetch_offset;
                    let n = {
                        let mut f = f.lock().unwrap();
                        f.push(at);
                        f.len()
                    };
                    let p = PartitionData::default().with_partition_index(0);
                    let p = match n {
                        1 => p.with_high_watermark(8).with_records(Some(batch.clone())),
                        // OFFSET_OUT_OF_RANGE: the retained log moved past the tail.
                        2 => p.with_error_code(1),
                        // NOT_LEADER_OR_FOLLOWER.
                        4 => p.with_error_code(6),
                        _ => p.with_high_watermark(at),
                    };
                    FetchResponse::default()
                        .with_responses(vec![FetchableTopicResponse::default()
                            .with_topic(TopicName(StrBytes::from_static_str("ledger")))
                            .with_partitions(vec![p])])
                        .encode(&mut out, v)
                }
                other => panic!("unexpected {other:?}"),
            }
            .expect("encode");
            out
        }),
    );
    let client = crate::Client::new(format!("{}:{}", broker.host, broker.port));
    let lock = client.lock("g").ledger_topic("ledger");
    let mut tail = ledger::LedgerTail::new(lock.reach(), "g", "ledger", Some(5));
    type Polled = crate::Result<Vec<(i64, Result<LedgerRecord, String>)>>;
    async fn poll_once(tail: &mut ledger::LedgerTail) -> Polled {
        tokio::time::timeout(PROMPTLY, tail.poll(Duration::from_secs(1)))
            .await
            .expect("a poll ends")
    }
    let first = poll_once(&mut tail).await.expect("the first poll");
    let offsets: Vec<i64> = first.iter().map(|(o, _)| *o).collect();
    assert_eq!(offsets, vec![5, 7], "{first:?}");
    assert_eq!(first[0].1.as_ref().ok(), Some(&acquired));
    assert!(first[1].1.is_err(), "{first:?}");
    let gone = poll_once(&mut tail).await.expect_err("OFFSET_OUT_OF_RANGE");
    assert!(
        matches!(&gone, Error::Broker { code, .. } if code.0 == 1),
        "{gone}"
    );
    assert!(poll_once(&mut tail).await.expect("from the end").is_empty());
    let moved = poll_once(&mut tail)
        .await
        .expect_err("NOT_LEADER_OR_FOLLOWER");
    assert!(
        matches!(&moved, Error::Broker { code, .. } if code.0 == 6),
        "{moved}"
    );
    assert!(poll_once(&mut tail)
        .await
        .expect("from where it was")
        .is_empty());
    use std::sync::atomic::Ordering::SeqCst;
    assert_eq!(*fetched.lock().unwrap(), vec![5, 8, 20, 20, 20]);
    assert_eq!(
        lists.load(SeqCst),
        1,
        "one ListOffsets, after OFFSET_OUT_OF_RANGE"
    );
    assert!(
        lookups.load(SeqCst) >= 3,
        "the leader looked up at first and after each failure"
    );
}

/// An entry of a v4 FindCoordinator answer naming `broker` for `key`, or `code` alone.
fn coordinator_entry(key: &str, broker: &crate::membership::Broker, code: i16) -> Coordinator {
    let c = Coordinator::default()
        .with_key(StrBytes::from_string(key.to_owned()))
        .with_error_code(code);
    if code != 0 {
        return c.with_node_id(BrokerId(-1)).with_port(-1);
    }
    c.with_node_id(BrokerId(broker.node_id))
        .with_host(StrBytes::from_string(broker.host.clone()))
        .with_port(broker.port)
}

/// Lookups queued while one is with the broker go out together in the next request (KIP-699),
/// and each lock hears its own key's entry alone: one key refused (GROUP_AUTHORIZATION_FAILED)
/// fails only that lookup.
#[tokio::test]
async fn lookups_queued_together_go_out_in_one_request_and_each_hears_its_own_key() {
    use crate::wire::coordinator::found_coordinator;
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let find = |key: String| {
        let pool = pool.clone();
        async move {
            match lookup::find_coordinator(&pool, &key, PROMPTLY).await {
                Ok((Response::FindCoordinator(r), v)) => {
                    assert!(v >= lookup::BATCH_VERSION);
                    found_coordinator(&r).map_err(crate::Error::from)
                }
                Ok((other, _)) => panic!("expected FindCoordinator, got {other:?}"),
                Err(e) => Err(e),
            }
        }
    };
    let first = tokio::spawn(find("first".into()));
    let mut boot = next_peer(&mut accepted).await;
    let (h1, r1) = boot
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    assert_eq!(r1.coordinator_keys.len(), 1, "{r1:?}");
    // Queued while the first is with the broker (the same group twice: asked once).
    let keys: Vec<String> = (0..8)
        .map(|i| format!("g{i}"))
        .chain(["g0".to_owned()])
        .collect();
    let mut later: Vec<_> = keys.iter().map(|k| Box::pin(find(k.clone()))).collect();
    // Polled once each: every one of them is queued before the first is answered.
    std::future::poll_fn(|cx| {
        for f in &mut later {
            assert!(std::future::Future::poll(f.as_mut(), cx).is_pending());
        }
        std::task::Poll::Ready(())
    })
    .await;
    boot.reply(
        &h1,
        &FindCoordinatorResponse::default()
            .with_coordinators(vec![coordinator_entry("first", &broker, 0)]),
    )
    .await;
    let (h2, r2) = boot
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    let asked: BTreeSet<String> = r2.coordinator_keys.iter().map(|k| k.to_string()).collect();
    let expected: BTreeSet<String> = (0..8).map(|i| format!("g{i}")).collect();
    assert_eq!(
        asked, expected,
        "the queued lookups in one request, each key once"
    );
    assert_eq!(r2.coordinator_keys.len(), 8);
    // Answered out of order, one key refused.
    let entries = (0..8)
        .rev()
        .map(|i| coordinator_entry(&format!("g{i}"), &broker, if i == 3 { 30 } else { 0 }))
        .collect();
    boot.reply(
        &h2,
        &FindCoordinatorResponse::default().with_coordinators(entries),
    )
    .await;
    let got = tokio::time::timeout(PROMPTLY, first)
        .await
        .expect("answered")
        .unwrap()
        .expect("first");
    assert_eq!(i32::from(got.port), broker.port);
    for (key, lookup) in keys.iter().zip(later) {
        let r = tokio::time::timeout(PROMPTLY, lookup)
            .await
            .expect("answered");
        match (key.as_str(), r) {
            ("g3", Err(Error::Broker { code, .. })) => {
                assert_eq!(code, crate::KafkaCode::GROUP_AUTHORIZATION_FAILED)
            }
            ("g3", other) => panic!("g3 should be refused, got {other:?}"),
            (_, Ok(c)) => assert_eq!(c.node_id, broker.node_id),
            (k, Err(e)) => panic!("{k}: {e}"),
        }
    }
    assert!(accepted.try_recv().is_err(), "one bootstrap connection");
}

/// A broker without FindCoordinator v4 gets one request per key, each answered to its lookup.
#[tokio::test]
async fn without_v4_each_lookup_is_a_request_of_its_own() {
    use crate::wire::coordinator::found_coordinator;
    const OLD: &[(ApiKey, i16, i16)] = &[
        (ApiKey::ApiVersions, 0, 3),
        (ApiKey::Metadata, 0, 9),
        (ApiKey::FindCoordinator, 0, 3),
        (ApiKey::JoinGroup, 0, 7),
        (ApiKey::SyncGroup, 0, 5),
        (ApiKey::Heartbeat, 0, 4),
        (ApiKey::LeaveGroup, 0, 4),
        (ApiKey::DescribeGroups, 0, 5),
    ];
    let (broker, mut accepted) = broker_with(OLD).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let lookups: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|k| {
            let pool = pool.clone();
            tokio::spawn(async move { lookup::find_coordinator(&pool, k, PROMPTLY).await })
        })
        .collect();
    let mut boot = next_peer(&mut accepted).await;
    let mut seen = BTreeSet::new();
    for _ in 0..3 {
        let (h, r) = boot
            .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
            .await;
        assert_eq!(h.request_api_version, 3);
        assert!(r.coordinator_keys.is_empty());
        let key = r.key.to_string();
        // Each answer names a node of its own, so a mix-up shows.
        let node = i32::from(key.as_bytes()[0]);
        boot.reply(
            &h,
            &FindCoordinatorResponse::default()
                .with_node_id(BrokerId(node))
                .with_host(StrBytes::from_static_str("127.0.0.1"))
                .with_port(broker.port),
        )
        .await;
        seen.insert(key);
    }
    assert_eq!(seen.len(), 3);
    for (k, task) in ["a", "b", "c"].iter().zip(lookups) {
        let (resp, v) = tokio::time::timeout(PROMPTLY, task)
            .await
            .expect("answered")
            .unwrap()
            .expect("lookup");
        assert_eq!(v, 3);
        let Response::FindCoordinator(r) = resp else {
            panic!("expected FindCoordinator")
        };
        let c = found_coordinator(&r).expect("found");
        assert_eq!(c.node_id, i32::from(k.as_bytes()[0]));
    }
}

/// Java's `Utils.abs(s.hashCode())`, as the test's own reckoning of Apache's `partitionFor`.
fn java_abs_hash(s: &str) -> u32 {
    let h = s
        .encode_utf16()
        .fold(0i32, |h, c| h.wrapping_mul(31).wrapping_add(i32::from(c)));
    if h == i32::MIN {
        0
    } else {
        h.unsigned_abs()
    }
}

/// Answers the Metadata request for `__consumer_offsets` with `partitions` partitions, or with
/// the error `code` alone.
async fn answer_offsets_metadata<S: AsyncRead + AsyncWrite + Unpin>(
    peer: &mut Peer<S>,
    partitions: usize,
    code: i16,
) {
    answer_offsets_metadata_led(peer, &vec![0; partitions], code).await
}

/// [`answer_offsets_metadata`] with partition `i` led by node `leaders[i]`.
async fn answer_offsets_metadata_led<S: AsyncRead + AsyncWrite + Unpin>(
    peer: &mut Peer<S>,
    leaders: &[i32],
    code: i16,
) {
    use kafka_protocol::messages::metadata_response::{
        MetadataResponsePartition, MetadataResponseTopic,
    };
    let (h, r) = peer.recv_as::<MetadataRequest>(ApiKey::Metadata).await;
    let topics = r.topics.expect("a topic list, not every topic");
    assert_eq!(
        topics[0].name.as_ref().map(|n| n.0.as_str()),
        Some("__consumer_offsets")
    );
    assert!(!r.allow_auto_topic_creation, "never creates the topic");
    let answer = MetadataResponse::default().with_topics(vec![MetadataResponseTopic::default()
        .with_name(Some(TopicName(StrBytes::from_static_str(
            "__consumer_offsets",
        ))))
        .with_error_code(code)
        .with_partitions(
            leaders
                .iter()
                .enumerate()
                .map(|(i, &leader)| {
                    MetadataResponsePartition::default()
                        .with_partition_index(i as i32)
                        .with_leader_id(kafka_protocol::messages::BrokerId(leader))
                })
                .collect(),
        )]);
    peer.reply(&h, &answer).await;
}

/// A client with several quick connections per broker reads `__consumer_offsets`' partition
/// count and places each group on the stripe of its partition under that count; refused
/// (no ACL), it keeps Apache's default 50 for good; absent (not created yet), it asks again.
#[tokio::test]
async fn a_groups_stripe_follows_the_clusters_offsets_partition_count() {
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let addr = format!("{}:{}", broker.host, broker.port);
    // A group whose stripe differs under 3 partitions and under 50.
    let group = (0..1000)
        .map(|i| format!("g{i}"))
        .find(|g| (java_abs_hash(g) % 3) % 4 != (java_abs_hash(g) % 50) % 4)
        .expect("such a group");
    let h = java_abs_hash(&group);

    let client = crate::Client::new(&addr).quick_connections(4);
    let pool = client.pool().clone();
    assert_eq!(pool.stripe(&group), ((h % 50) % 4) as usize);
    let conn = pool.quick(None, 0).await.unwrap();
    let mut boot = next_peer(&mut accepted).await;
    tokio::join!(
        pool.learn_offsets_partitions(&conn),
        answer_offsets_metadata(&mut boot, 3, 0)
    );
    // One node leads the three partitions: each has stripes of its own (0 and 3, 1, 2).
    assert_eq!(pool.stripe(&group) % 3, (h % 3) as usize);

    // Refused: the default, and no more asking.
    let refused = crate::Client::new(&addr).quick_connections(4);
    let pool = refused.pool().clone();
    let conn = pool.quick(None, 0).await.unwrap();
    let mut boot = next_peer(&mut accepted).await;
    tokio::join!(
        pool.learn_offsets_partitions(&conn),
        answer_offsets_metadata(&mut boot, 0, 29)
    );
    assert_eq!(pool.stripe(&group), ((h % 50) % 4) as usize);
    pool.learn_offsets_partitions(&conn).await;
    let (hb, ()) = tokio::join!(conn.request(heartbeat(1)), async {
        let (h, _) = boot.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;
        boot.reply(&h, &HeartbeatResponse::default()).await;
    });
    hb.expect("the next request is this Heartbeat, not another Metadata");

    // Absent: asked again at the next need.
    let fresh = crate::Client::new(&addr).quick_connections(4);
    let pool = fresh.pool().clone();
    let conn = pool.quick(None, 0).await.unwrap();
    let mut boot = next_peer(&mut accepted).await;
    tokio::join!(
        pool.learn_offsets_partitions(&conn),
        answer_offsets_metadata(&mut boot, 0, 3)
    );
    assert_eq!(pool.stripe(&group), ((h % 50) % 4) as usize);
    tokio::join!(
        pool.learn_offsets_partitions(&conn),
        answer_offsets_metadata(&mut boot, 3, 0)
    );
    assert_eq!(pool.stripe(&group) % 3, (h % 3) as usize);
}

/// A client with four stripes that has learned `__consumer_offsets` partitions led by `leaders`.
async fn learn_placement(
    addr: &str,
    accepted: &mut tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
    leaders: Vec<i32>,
) -> Arc<pool::Pool> {
    let client = crate::Client::new(addr).quick_connections(4);
    let pool = client.pool().clone();
    let conn = pool.quick(None, 0).await.unwrap();
    let mut boot = next_peer(accepted).await;
    tokio::join!(
        pool.learn_offsets_partitions(&conn),
        answer_offsets_metadata_led(&mut boot, &leaders, 0)
    );
    pool
}

/// A broker that leads fewer `__consumer_offsets` partitions than the client has stripes shares
/// all its stripes out among them (three nodes leading one partition each: every partition's
/// groups spread over the four stripes, where `partition % 4` put each node's on one
/// connection), while a broker leading as many as the stripes or more keeps a partition's
/// groups on `partition % stripes`. Within a node, two partitions never share a stripe.
#[tokio::test]
async fn a_broker_leading_fewer_partitions_than_stripes_spreads_them_over_every_stripe() {
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let addr = format!("{}:{}", broker.host, broker.port);
    let groups: Vec<String> = (0..400).map(|i| format!("g{i}")).collect();
    // Three nodes, one partition each.
    let pool = learn_placement(&addr, &mut accepted, vec![1, 2, 3]).await;
    for p in 0..3 {
        let stripes: BTreeSet<usize> = groups
            .iter()
            .filter(|g| java_abs_hash(g) % 3 == p)
            .map(|g| pool.stripe(g))
            .collect();
        assert_eq!(stripes, (0..4).collect(), "partition {p}'s groups");
    }
    // Two nodes, one partition each: a partition count with a factor in common with the stripe
    // count still spreads each partition's groups over every stripe (the hash past the
    // partition picks one, not the whole hash times the partition count).
    let pool = learn_placement(&addr, &mut accepted, vec![1, 2]).await;
    for p in 0..2 {
        let stripes: BTreeSet<usize> = groups
            .iter()
            .filter(|g| java_abs_hash(g) % 2 == p)
            .map(|g| pool.stripe(g))
            .collect();
        assert_eq!(stripes, (0..4).collect(), "partition {p} of two's groups");
    }

    // One node leading two of them, another the third: the two share its stripes out.
    let pool = learn_placement(&addr, &mut accepted, vec![1, 1, 2]).await;
    for g in &groups {
        let p = java_abs_hash(g) % 3;
        let s = pool.stripe(g);
        match p {
            0 => assert!(s == 0 || s == 2, "{g}: partition 0 on stripe {s}"),
            1 => assert!(s == 1 || s == 3, "{g}: partition 1 on stripe {s}"),
            _ => assert!(s < 4),
        }
    }

    // As many partitions as stripes or more on a node: the partition's own stripe.
    let pool = learn_placement(&addr, &mut accepted, vec![1; 50]).await;
    for g in &groups {
        assert_eq!(pool.stripe(g), (java_abs_hash(g) % 50) as usize % 4, "{g}");
    }
}

/// Queues `keys` behind a first lookup that is with the broker, answers the first, and returns
/// the lookups of `keys` (each polled once, so queued) with the request they went out in.
async fn queue_behind_a_first_lookup(
    pool: &Arc<pool::Pool>,
    accepted: &mut tokio::sync::mpsc::UnboundedReceiver<Peer<tokio::net::TcpStream>>,
    broker: &crate::membership::Broker,
    keys: &[&str],
) -> (
    Peer<tokio::net::TcpStream>,
    Vec<
        std::pin::Pin<
            Box<
                impl std::future::Future<Output = crate::error::Result<crate::membership::Broker>>
                    + use<>,
            >,
        >,
    >,
    kafka_protocol::messages::RequestHeader,
    FindCoordinatorRequest,
) {
    use crate::wire::coordinator::found_coordinator;
    let find = |key: String| {
        let pool = pool.clone();
        async move {
            match lookup::find_coordinator(&pool, &key, PROMPTLY).await {
                Ok((Response::FindCoordinator(r), _)) => found_coordinator(&r)
                    .map(|c| crate::membership::Broker {
                        node_id: c.node_id,
                        host: c.host,
                        port: i32::from(c.port),
                    })
                    .map_err(crate::Error::from),
                Ok((other, _)) => panic!("expected FindCoordinator, got {other:?}"),
                Err(e) => Err(e),
            }
        }
    };
    let first = tokio::spawn(find("first".into()));
    let mut boot = next_peer(accepted).await;
    let (h1, _) = boot
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    let mut later: Vec<_> = keys
        .iter()
        .map(|k| Box::pin(find((*k).to_owned())))
        .collect();
    std::future::poll_fn(|cx| {
        for f in &mut later {
            assert!(std::future::Future::poll(f.as_mut(), cx).is_pending());
        }
        std::task::Poll::Ready(())
    })
    .await;
    boot.reply(
        &h1,
        &FindCoordinatorResponse::default()
            .with_coordinators(vec![coordinator_entry("first", broker, 0)]),
    )
    .await;
    tokio::time::timeout(PROMPTLY, first)
        .await
        .expect("first answered")
        .unwrap()
        .expect("first found");
    let (h2, r2) = boot
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    (boot, later, h2, r2)
}

/// A batched answer that is garbage (a key missing, a key answered twice with different
/// coordinators, keys nobody asked for, a key in another case) never hands a lock another
/// lock's coordinator and never leaves a lookup without an answer: a key with no entry of its
/// own fails with a protocol error, at once.
#[tokio::test]
async fn a_garbled_batched_answer_misroutes_no_lookup_and_strands_none() {
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let keys = ["missing", "twice", "cased", "own"];
    let task = {
        let pool = pool.clone();
        let broker = broker.clone();
        async move {
            let (mut boot, later, h2, r2) =
                queue_behind_a_first_lookup(&pool, &mut accepted, &broker, &keys).await;
            assert_eq!(r2.coordinator_keys.len(), keys.len());
            let at = |node: i32| crate::membership::Broker {
                node_id: node,
                ..broker.clone()
            };
            // Each entry names a node of its own, so a mix-up shows.
            let entries = vec![
                coordinator_entry("stranger", &at(99), 0),
                coordinator_entry("twice", &at(2), 0),
                coordinator_entry("twice", &at(98), 0),
                coordinator_entry("CASED", &at(97), 0),
                coordinator_entry("own", &at(4), 0),
                coordinator_entry("", &at(96), 0),
            ];
            boot.reply(
                &h2,
                &FindCoordinatorResponse::default().with_coordinators(entries),
            )
            .await;
            let mut out = Vec::new();
            for (key, l) in keys.iter().zip(later) {
                out.push((*key, tokio::time::timeout(PROMPTLY, l).await));
            }
            out
        }
    };
    for (key, r) in task.await {
        let r = r.unwrap_or_else(|_| panic!("{key}: the lookup was left without an answer"));
        match (key, r) {
            ("missing" | "cased", Err(Error::Protocol(_))) => {}
            ("twice", Ok(b)) => assert_eq!(b.node_id, 2, "the first entry of a repeated key"),
            ("own", Ok(b)) => assert_eq!(b.node_id, 4),
            (k, other) => panic!("{k}: {other:?}"),
        }
    }
}

/// The bootstrap connection dropping while a batch is with the broker fails every lookup of
/// the batch at once (none waits for its timeout), and the next lookup goes out on a fresh
/// connection: one failed request does not wedge the client's lookups.
#[tokio::test]
async fn a_batch_whose_connection_drops_fails_its_lookups_at_once_and_the_next_goes_out() {
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let keys = ["a", "b", "c"];
    let (boot, later, _h2, r2) =
        queue_behind_a_first_lookup(&pool, &mut accepted, &broker, &keys).await;
    assert_eq!(r2.coordinator_keys.len(), 3);
    drop(boot);
    // Far less than the lookups' own timeout (PROMPTLY): the failure, not a timer, ends them.
    let quickly = PROMPTLY / 4;
    for (key, l) in keys.iter().zip(later) {
        let r = tokio::time::timeout(quickly, l)
            .await
            .unwrap_or_else(|_| panic!("{key}: still waiting after its connection dropped"));
        assert!(r.is_err(), "{key}: {r:?}");
    }
    let again = {
        let pool = pool.clone();
        tokio::spawn(async move { lookup::find_coordinator(&pool, "d", PROMPTLY).await })
    };
    let mut fresh = next_peer(&mut accepted).await;
    let (h, r) = fresh
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    assert_eq!(r.coordinator_keys.len(), 1);
    fresh
        .reply(
            &h,
            &FindCoordinatorResponse::default()
                .with_coordinators(vec![coordinator_entry("d", &broker, 0)]),
        )
        .await;
    tokio::time::timeout(PROMPTLY, again)
        .await
        .expect("answered")
        .unwrap()
        .expect("found on a fresh connection");
}

/// Apache answers the requests of one connection one at a time, in order (SocketServer's
/// Processor mutes a channel from a request's receipt until its response is sent), and may hold
/// a Heartbeat for up to `offsets.commit.timeout.ms` (GroupCoordinatorService `heartbeat`:
/// `scheduleWriteOperation`). A DescribeGroups sent behind such a Heartbeat on the client's
/// shared quick connection then waits past its own timeout. Its caller hears of the timeout,
/// but the connection must not be closed under the Heartbeat, which the lock keeps registered
/// for the broker's own bound so that its answer is read (`session::exchange`).
#[tokio::test]
async fn a_description_timing_out_behind_a_held_heartbeat_leaves_the_heartbeat_its_answer() {
    use kafka_protocol::messages::DescribeGroupsRequest;
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let lock = client.lock("g").request_timeout(Duration::from_millis(300));

    // A held lock's Heartbeat on the coordinator's quick connection, registered for the
    // broker's bound as the session registers it; the broker holds it.
    let conn = pool.quick(Some(&broker), pool.stripe("g")).await.unwrap();
    let mut coord = next_peer(&mut accepted).await;
    let hb = {
        let conn = conn.clone();
        tokio::spawn(async move { conn.request_with_timeout(heartbeat(1), PROMPTLY * 2).await })
    };
    let (h, _) = coord.recv_as::<HeartbeatRequest>(ApiKey::Heartbeat).await;

    // A description of the same group, through the client: it lands behind the Heartbeat.
    let mut watch = describe::GroupWatch::new(lock.reach(), "g");
    let described = tokio::spawn(async move { watch.describe_once().await });
    let mut boot = next_peer(&mut accepted).await;
    let (fh, _) = boot
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    boot.reply(
        &fh,
        &FindCoordinatorResponse::default()
            .with_coordinators(vec![coordinator_entry("g", &broker, 0)]),
    )
    .await;
    let _ = coord
        .recv_as::<DescribeGroupsRequest>(ApiKey::DescribeGroups)
        .await;
    let d = tokio::time::timeout(PROMPTLY, described)
        .await
        .expect("the description ended at its timeout")
        .expect("task");
    assert!(matches!(d, Err(Error::Timeout { .. })), "{d:?}");

    // The broker answers the Heartbeat at last.
    coord.reply(&h, &HeartbeatResponse::default()).await;
    let answered = tokio::time::timeout(PROMPTLY, hb)
        .await
        .expect("the heartbeat ended")
        .expect("task");
    assert!(
        answered.is_ok(),
        "the description's timeout closed the connection under a held lock's Heartbeat: {answered:?}"
    );
}

/// A client kept across runtimes (tests that each start their own, a library that builds one per
/// job) whose lookup task was dropped mid-request with its runtime still looks coordinators up:
/// the dropped task gives its turn back instead of leaving every later lookup queued behind no
/// one. (The connection lives on the runtime that opened it and outlives the dropped one.)
#[test]
fn a_lookup_task_dropped_with_its_runtime_gives_its_turn_back() {
    let home = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (broker, mut accepted) = home.block_on(broker_with(BROKER_APIS));
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(1);
    let pool = client.pool().clone();
    let find = |key: &'static str| {
        let pool = pool.clone();
        async move { lookup::find_coordinator(&pool, key, PROMPTLY).await }
    };

    // The bootstrap connection is opened on `home` by a first lookup, answered.
    let mut boot = home.block_on(async {
        let warm = tokio::spawn(find("warm"));
        let mut boot = next_peer(&mut accepted).await;
        let (h, _) = boot
            .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
            .await;
        let entry = coordinator_entry("warm", &broker, 0);
        boot.reply(
            &h,
            &FindCoordinatorResponse::default().with_coordinators(vec![entry]),
        )
        .await;
        tokio::time::timeout(PROMPTLY, warm)
            .await
            .expect("warm lookup")
            .expect("task")
            .expect("warm lookup answered");
        boot
    });

    // A lookup started on a runtime of its own reaches the broker; that runtime then ends.
    let asked = home.spawn(async move {
        let (h, _) = boot
            .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
            .await;
        (boot, h)
    });
    let other = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let (mut boot, first) = other.block_on(async {
        tokio::spawn(find("first"));
        tokio::time::timeout(PROMPTLY, asked)
            .await
            .expect("the lookup never reached the broker")
            .expect("broker task")
    });
    drop(other);

    home.block_on(async {
        let second = tokio::spawn(find("second"));
        let entry = coordinator_entry("first", &broker, 0);
        boot.reply(
            &first,
            &FindCoordinatorResponse::default().with_coordinators(vec![entry]),
        )
        .await;
        let (h, r) = tokio::time::timeout(
            PROMPTLY,
            boot.recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator),
        )
        .await
        .expect("no lookup went out after the runtime of the one before it ended");
        assert_eq!(r.coordinator_keys.len(), 1, "{r:?}");
        assert_eq!(r.coordinator_keys[0].as_str(), "second");
        let entry = coordinator_entry("second", &broker, 0);
        boot.reply(
            &h,
            &FindCoordinatorResponse::default().with_coordinators(vec![entry]),
        )
        .await;
        tokio::time::timeout(PROMPTLY, second)
            .await
            .expect("second lookup")
            .expect("task")
            .expect("second lookup answered");
    });
}

/// Lookups are striped like the quick connections: while one stripe's batch is with a broker
/// that does not answer it (an overloaded bootstrap broker, until the lookup's timeout closes
/// that connection), a lookup of another stripe goes out on its own bootstrap connection and
/// is answered; it is neither in the held batch nor queued behind it. Only the held batch's
/// lookups fail.
#[tokio::test]
async fn a_held_lookup_batch_holds_back_only_its_own_stripes_lookups() {
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let client =
        crate::Client::new(format!("{}:{}", broker.host, broker.port)).quick_connections(2);
    let pool = client.pool().clone();
    let held_key = "held".to_owned();
    let other_key = (0..100)
        .map(|i| format!("other{i}"))
        .find(|k| pool.stripe(k) != pool.stripe(&held_key))
        .expect("a group on the other stripe");
    let find = |key: String| {
        let pool = pool.clone();
        tokio::spawn(async move { lookup::find_coordinator(&pool, &key, PROMPTLY * 3).await })
    };
    let held = find(held_key.clone());
    let mut first = next_peer(&mut accepted).await;
    let (_, r) = first
        .recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator)
        .await;
    assert_eq!(r.coordinator_keys[0].as_str(), held_key);

    // Never answered while the other stripe's lookup is made.
    let other = find(other_key.clone());
    let mut second = next_peer(&mut accepted).await;
    let (h, r) = tokio::time::timeout(
        PROMPTLY,
        second.recv_as::<FindCoordinatorRequest>(ApiKey::FindCoordinator),
    )
    .await
    .expect("the other stripe's lookup went out while the first was held");
    assert_eq!(r.coordinator_keys.len(), 1);
    assert_eq!(r.coordinator_keys[0].as_str(), other_key);
    second
        .reply(
            &h,
            &FindCoordinatorResponse::default()
                .with_coordinators(vec![coordinator_entry(&other_key, &broker, 0)]),
        )
        .await;
    tokio::time::timeout(PROMPTLY, other)
        .await
        .expect("answered while the other batch is held")
        .unwrap()
        .expect("found");
    assert!(!held.is_finished(), "the held lookup has no answer yet");

    // The held broker's connection goes: its lookup fails, and only it.
    drop(first);
    let r = tokio::time::timeout(PROMPTLY, held)
        .await
        .expect("the held lookup ends with its connection")
        .unwrap();
    assert!(r.is_err(), "{r:?}");
}

/// A stripe count of any size places groups as a small one does: a partition whose leader leads
/// fewer partitions than there are stripes picks among the stripes `i` more than a multiple of
/// its leader's partition count, computed when asked. Listing them (a `Vec` per partition)
/// took memory and time in proportion to the count: `quick_connections(usize::MAX)` never
/// finished learning the placement.
#[tokio::test]
async fn a_stripe_count_of_any_size_places_groups_without_listing_the_stripes() {
    let (broker, mut accepted) = broker_with(BROKER_APIS).await;
    let addr = format!("{}:{}", broker.host, broker.port);
    let client = crate::Client::new(&addr).quick_connections(usize::MAX);
    let pool = client.pool().clone();
    let conn = pool.quick(None, 0).await.unwrap();
    let mut boot = next_peer(&mut accepted).await;
    // One node leading two partitions, another the third.
    tokio::join!(
        pool.learn_offsets_partitions(&conn),
        answer_offsets_metadata_led(&mut boot, &[1, 1, 2], 0)
    );
    let mut seen = BTreeSet::new();
    for i in 0..400 {
        let g = format!("g{i}");
        let (p, s) = (java_abs_hash(&g) % 3, pool.stripe(&g));
        match p {
            0 | 1 => assert_eq!(s % 2, p as usize, "{g}: partition {p} on stripe {s}"),
            _ => {}
        }
        seen.insert(s);
    }
    assert!(seen.len() > 100, "groups spread over the stripes: {seen:?}");
}

/// Bounds of any size make a client: a semaphore holds at most `Semaphore::MAX_PERMITS`, and
/// `Semaphore::new` panics beyond, so `acquisitions_at_once(usize::MAX)` (or
/// `parking_lanes`) panicked where it means no bound.
#[test]
fn bounds_of_any_size_make_a_client() {
    let client = crate::Client::new("127.0.0.1:9")
        .acquisitions_at_once(usize::MAX)
        .parking_lanes(usize::MAX);
    let _ = client.lock("any");
}

/// `acquisitions_at_once` bounds the acquisitions between their start and their first
/// generation: the places are taken in turn, one given back lets the next in, and without a
/// bound nobody waits.
#[tokio::test]
async fn admissions_beyond_the_bound_wait_for_a_place() {
    let bounded = Arc::new(pool::Pool::new(pool::PoolConfig {
        acquisitions_at_once: 2,
        ..pool_config(1, 1)
    }));
    let first = tokio::time::timeout(PROMPTLY, bounded.admit())
        .await
        .expect("a free place is given at once");
    let second = tokio::time::timeout(PROMPTLY, bounded.admit())
        .await
        .expect("a free place is given at once");
    assert!(first.is_some() && second.is_some(), "a bound gives places");
    let mut third = tokio::spawn({
        let bounded = bounded.clone();
        async move { bounded.admit().await.is_some() }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut third)
            .await
            .is_err(),
        "a third acquisition was let in while two held the places"
    );
    drop(first);
    assert!(
        tokio::time::timeout(PROMPTLY, third)
            .await
            .expect("a place given back lets the next in")
            .unwrap(),
        "the next one holds a place"
    );
    let unbounded = lane_pool(1);
    assert!(tokio::time::timeout(PROMPTLY, unbounded.admit())
        .await
        .expect("no bound: nobody waits")
        .is_none());
    drop(second);
}

/// Two lanes are the smallest cap that keeps one in reserve: a second first join waits, and an
/// urgent request gets the reserve lane without an overflow.
#[tokio::test]
async fn with_two_lanes_one_is_kept_for_urgent_requests() {
    use pool::Park;
    let (broker, mut accepted) = lane_broker().await;
    let pool = lane_pool(2);
    let fresh = tokio::time::timeout(PROMPTLY, pool.lane(&broker, Park::Fresh))
        .await
        .expect("a free lane is lent at once")
        .unwrap();
    let mut waiting = tokio::spawn({
        let (pool, broker) = (pool.clone(), broker.clone());
        async move { pool.lane(&broker, Park::Fresh).await.map(|l| l.done()) }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut waiting)
            .await
            .is_err(),
        "a second fresh request took the reserve lane"
    );
    let urgent = tokio::time::timeout(PROMPTLY, pool.lane(&broker, Park::Urgent))
        .await
        .expect("the reserve lane is lent")
        .unwrap();
    let mut servers = Vec::new();
    for _ in 0..2 {
        servers.push(
            tokio::time::timeout(PROMPTLY, accepted.recv())
                .await
                .expect("a connection per lane")
                .unwrap(),
        );
    }
    // Within the cap: the urgent lane goes back to the pool rather than being closed.
    urgent.done();
    fresh.done();
    tokio::time::timeout(PROMPTLY, waiting)
        .await
        .expect("a returned lane serves the waiting request")
        .unwrap()
        .unwrap();
    assert!(accepted.try_recv().is_err(), "returned lanes are reused");
    drop(servers);
}

/// A Heartbeat the coordinator holds (its offsets partition behind on commits, as during a
/// burst of first joins) halves the client's admission window, places given out included as
/// they come back; one sent before that cut and held as long does not cut again, one sent after
/// it does; a prompt one leaves the window; each window's worth of acquisitions that reach
/// their first generation with no slow heartbeat among them widens it by one, up to the
/// ceiling.
#[tokio::test]
async fn a_held_heartbeat_narrows_the_admission_window_and_acquisitions_widen_it() {
    use crate::membership::{Lane, Target, Transmit};
    let (broker, mut accepted) = lane_broker().await;
    let net = session_on(
        Arc::new(pool::Pool::new(pool::PoolConfig {
            acquisitions_at_once: 8,
            ..pool_config(4, 1)
        })),
        0,
    );
    let pool = net.pool.clone();
    let mut places = Vec::new();
    for _ in 0..8 {
        places.push(admit_promptly(&pool).await);
    }
    let (answers_tx, mut answers) = tokio::sync::mpsc::unbounded_channel();
    // Slow: answered after more than a quarter of this.
    let request_timeout = Duration::from_secs(4);
    let held_for = request_timeout / 2;
    let send = |id: u64| {
        let t = Transmit {
            id,
            target: Target::Coordinator {
                broker: broker.clone(),
                lane: Lane::Control,
            },
            request: heartbeat(1).into(),
            version: 4,
            timeout: request_timeout,
        };
        session::send_on_task(&net, t, pool::Park::Urgent, answers_tx.clone());
    };
    send(1);
    send(2);
    let mut server = tokio::time::timeout(PROMPTLY, accepted.recv())
        .await
        .expect("the quick connection is opened")
        .unwrap();
    let first = received(&mut server).await;
    let second = received(&mut server).await;
    // The coordinator holds both (the scripted delay), then answers them.
    tokio::time::sleep(held_for).await;
    for held in [&first, &second] {
        server.reply(held, &HeartbeatResponse::default()).await;
        assert!(
            answered(&mut answers).await.2.is_ok(),
            "a held heartbeat is answered"
        );
    }
    assert_eq!(
        pool.admission_window(),
        Some(4),
        "held heartbeats sent before one cut halve the window once"
    );
    // The four places cut were all given out: the first four back are taken out of use.
    places.truncate(4);
    let mut ninth = tokio::spawn({
        let pool = pool.clone();
        async move { pool.admit().await.is_some() }
    });
    assert!(
        tokio::time::timeout(Duration::from_millis(200), &mut ninth)
            .await
            .is_err(),
        "an acquisition was let in beyond the narrowed window"
    );
    places.truncate(3);
    assert!(
        tokio::time::timeout(PROMPTLY, ninth)
            .await
            .expect("a place given back within the window lets the next in")
            .unwrap(),
        "the next one holds a place"
    );
    drop(places);
    send(3);
    let prompt = received(&mut server).await;
    server.reply(&prompt, &HeartbeatResponse::default()).await;
    assert!(
        answered(&mut answers).await.2.is_ok(),
        "the prompt heartbeat is answered"
    );
    assert_eq!(pool.admission_window(), Some(4), "a prompt heartbeat cut");
    // Two more held together: the first cuts, the second, sent before that cut, does not cut
    // again but still says the backlog is there, so what completed before it does not count.
    send(4);
    send(5);
    let fourth = received(&mut server).await;
    let fifth = received(&mut server).await;
    tokio::time::sleep(held_for).await;
    server.reply(&fourth, &HeartbeatResponse::default()).await;
    assert!(
        answered(&mut answers).await.2.is_ok(),
        "the held heartbeat is answered"
    );
    assert_eq!(
        pool.admission_window(),
        Some(2),
        "a heartbeat sent after a cut and held cuts again"
    );
    admit_promptly(&pool).await.completed();
    server.reply(&fifth, &HeartbeatResponse::default()).await;
    assert!(
        answered(&mut answers).await.2.is_ok(),
        "the held heartbeat is answered"
    );
    assert_eq!(pool.admission_window(), Some(2), "sent before the cut");
    admit_promptly(&pool).await.completed();
    assert_eq!(
        pool.admission_window(),
        Some(2),
        "grown on an acquisition completed before a slow heartbeat"
    );
    admit_promptly(&pool).await.completed();
    for size in 3..=8 {
        assert_eq!(
            pool.admission_window(),
            Some(size),
            "a window's worth widens by one"
        );
        let mut round = Vec::new();
        for _ in 0..size {
            round.push(admit_promptly(&pool).await);
        }
        round.into_iter().for_each(pool::Admit::completed);
    }
    assert_eq!(pool.admission_window(), Some(8), "never past the ceiling");
    let mut full = Vec::new();
    for _ in 0..8 {
        full.push(admit_promptly(&pool).await);
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(200), pool.admit())
            .await
            .is_err(),
        "an acquisition was let in beyond the ceiling"
    );
    drop(full);
}

async fn received(server: &mut Peer<tokio::net::TcpStream>) -> RequestHeader {
    tokio::time::timeout(PROMPTLY, server.recv())
        .await
        .expect("the heartbeat reaches the broker")
        .0
}

async fn admit_promptly(pool: &pool::Pool) -> pool::Admit {
    tokio::time::timeout(PROMPTLY, pool.admit())
        .await
        .expect("a free place is given at once")
        .expect("a bound gives places")
}

async fn answered(
    answers: &mut tokio::sync::mpsc::UnboundedReceiver<session::Answer>,
) -> (session::Source, u64, crate::error::Result<(Response, i16)>) {
    tokio::time::timeout(PROMPTLY, answers.recv())
        .await
        .expect("every request is answered or failed")
        .map(|answer| *answer)
        .unwrap()
}

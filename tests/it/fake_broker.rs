//! A scripted coordinator on a loopback port, for Apache Kafka behaviour the test broker (tansu)
//! cannot be made to show: it answers each request with whatever the test's closure returns.
//!
//! It speaks just enough of the protocol: ApiVersions (Apache 4.x's ranges for the APIs
//! kafka-lock uses), FindCoordinator naming itself, and everything else through the closure,
//! which may hold an answer (`start_parking`) as Apache holds a request waiting for replicas,
//! or until the test lets it go (`start_gated`).

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use kafka_protocol::messages::api_versions_response::{ApiVersion, ApiVersionsResponse};
use kafka_protocol::messages::find_coordinator_response::{Coordinator, FindCoordinatorResponse};
use kafka_protocol::messages::join_group_response::JoinGroupResponseMember;
use kafka_protocol::messages::{
    ApiKey, BrokerId, FindCoordinatorRequest, JoinGroupRequest, JoinGroupResponse, RequestHeader,
    ResponseHeader, SyncGroupRequest, SyncGroupResponse,
};
use kafka_protocol::protocol::{Decodable, Encodable, StrBytes};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// What a scripted answer is: the encoded body for (api, version, request body bytes), or None to
/// close the connection.
pub type Script = dyn Fn(ApiKey, i16, &mut BytesMut) -> Option<BytesMut> + Send + Sync;

/// A script that may hold its answer: for (connection number, api, version, body) the encoded
/// body and how long to wait before sending it, or None to close the connection. Each connection
/// is served one request at a time, in order, as Apache's socket server does: a held answer
/// holds every later request on its connection.
pub type ParkingScript =
    dyn Fn(usize, ApiKey, i16, &mut BytesMut) -> Option<(BytesMut, Duration)> + Send + Sync;

/// What a gated answer waits for before it is sent.
pub type Hold = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A [`ParkingScript`] whose answer waits for a future (a test's gate) instead of a fixed time:
/// for a test that must act while an answer is held and then let it go.
pub type GatedScript =
    dyn Fn(usize, ApiKey, i16, &mut BytesMut) -> Option<(BytesMut, Hold)> + Send + Sync;

/// A running fake; it stops when dropped (the runtime that owns it ends with the test).
pub struct FakeBroker {
    pub addr: SocketAddr,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
    /// ApiVersions requests answered so far, on every connection.
    pub api_versions: Arc<AtomicUsize>,
    /// FindCoordinator requests answered so far.
    pub lookups: Arc<AtomicUsize>,
    /// While above 0, each FindCoordinator takes one from it and is answered
    /// COORDINATOR_NOT_AVAILABLE instead of naming this broker.
    pub refuse_lookups: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeBroker {
    fn drop(&mut self) {
        self.task.abort();
    }
}

const RANGES: &[(ApiKey, i16, i16)] = &[
    (ApiKey::ApiVersions, 0, 4),
    (ApiKey::Metadata, 0, 12),
    (ApiKey::FindCoordinator, 0, 6),
    (ApiKey::JoinGroup, 0, 9),
    (ApiKey::SyncGroup, 0, 5),
    (ApiKey::Heartbeat, 0, 4),
    (ApiKey::LeaveGroup, 0, 5),
    (ApiKey::DescribeGroups, 0, 5),
    (ApiKey::OffsetCommit, 0, 9),
    (ApiKey::OffsetFetch, 0, 9),
    (ApiKey::Produce, 3, 11),
    (ApiKey::Fetch, 4, 12),
    (ApiKey::ListOffsets, 1, 7),
];

pub async fn start(script: Arc<Script>) -> FakeBroker {
    start_parking(Arc::new(move |_conn, api, version, body: &mut BytesMut| {
        script(api, version, body).map(|b| (b, Duration::ZERO))
    }))
    .await
}

/// [`start`] with answers the script may hold.
pub async fn start_parking(script: Arc<ParkingScript>) -> FakeBroker {
    start_gated(Arc::new(move |conn, api, version, body: &mut BytesMut| {
        script(conn, api, version, body)
            .map(|(b, hold)| (b, Box::pin(tokio::time::sleep(hold)) as Hold))
    }))
    .await
}

/// [`start`] with answers that wait for what the script says.
pub async fn start_gated(script: Arc<GatedScript>) -> FakeBroker {
    start_gated_with(script, &[]).await
}

/// [`start`], offering `extra` APIs (min and max version) besides the usual ones, for the
/// script to answer.
pub async fn start_with_apis(
    script: Arc<Script>,
    extra: &'static [(ApiKey, i16, i16)],
) -> FakeBroker {
    start_gated_with(
        Arc::new(move |_conn, api, version, body: &mut BytesMut| {
            script(api, version, body).map(|b| (b, ready()))
        }),
        extra,
    )
    .await
}

async fn start_gated_with(
    script: Arc<GatedScript>,
    extra: &'static [(ApiKey, i16, i16)],
) -> FakeBroker {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = Arc::new(AtomicUsize::new(0));
    let versions_asked = Arc::new(AtomicUsize::new(0));
    let lookups = Arc::new(AtomicUsize::new(0));
    let refuse_lookups = Arc::new(AtomicUsize::new(0));
    let (accepted, asked, looked_up, refusing) = (
        connections.clone(),
        versions_asked.clone(),
        lookups.clone(),
        refuse_lookups.clone(),
    );
    let task = tokio::spawn(async move {
        loop {
            let Ok((mut sock, _)) = listener.accept().await else {
                return;
            };
            let conn = accepted.fetch_add(1, Ordering::SeqCst) + 1;
            let script = script.clone();
            let asked = asked.clone();
            let looked_up = looked_up.clone();
            let refusing = refusing.clone();
            tokio::spawn(async move {
                loop {
                    let mut len = [0u8; 4];
                    if sock.read_exact(&mut len).await.is_err() {
                        return;
                    }
                    let mut frame = vec![0u8; u32::from_be_bytes(len) as usize];
                    if sock.read_exact(&mut frame).await.is_err() {
                        return;
                    }
                    let mut buf = BytesMut::from(&frame[..]);
                    let api = ApiKey::try_from(i16::from_be_bytes([buf[0], buf[1]])).unwrap();
                    let version = i16::from_be_bytes([buf[2], buf[3]]);
                    let header =
                        RequestHeader::decode(&mut buf, api.request_header_version(version))
                            .unwrap();
                    let answer = match api {
                        ApiKey::ApiVersions => {
                            asked.fetch_add(1, Ordering::SeqCst);
                            Some((api_versions(version, extra), ready()))
                        }
                        ApiKey::FindCoordinator => {
                            looked_up.fetch_add(1, Ordering::SeqCst);
                            let refuse = refusing
                                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                                    n.checked_sub(1)
                                })
                                .is_ok();
                            let answer = if refuse {
                                find_coordinator_refused(version, &mut buf)
                            } else {
                                find_coordinator(addr, version, &mut buf)
                            };
                            Some((answer, ready()))
                        }
                        _ => script(conn, api, version, &mut buf),
                    };
                    let Some((body, hold)) = answer else { return };
                    hold.await;
                    let mut out = BytesMut::new();
                    let mut rh = ResponseHeader::default();
                    rh.correlation_id = header.correlation_id;
                    rh.encode(&mut out, api.response_header_version(version))
                        .unwrap();
                    out.put_slice(&body);
                    let mut framed = BytesMut::new();
                    framed.put_u32(out.len() as u32);
                    framed.put_slice(&out);
                    if sock.write_all(&framed).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    FakeBroker {
        addr,
        connections,
        api_versions: versions_asked,
        lookups,
        refuse_lookups,
        task,
    }
}

/// A hold that is over at once.
pub fn ready() -> Hold {
    Box::pin(std::future::ready(()))
}

fn api_versions(version: i16, extra: &[(ApiKey, i16, i16)]) -> BytesMut {
    let mut r = ApiVersionsResponse::default();
    r.api_keys = RANGES
        .iter()
        .chain(extra)
        .map(|(k, min, max)| {
            let mut v = ApiVersion::default();
            v.api_key = *k as i16;
            v.min_version = *min;
            v.max_version = *max;
            v
        })
        .collect();
    encode(&r, version)
}

/// Names this broker as the coordinator of every key asked: from v4 one entry per key of the
/// request, as Apache answers, since each lookup reads its own key's entry.
fn find_coordinator(addr: SocketAddr, version: i16, body: &mut BytesMut) -> BytesMut {
    let mut r = FindCoordinatorResponse::default();
    if version >= 4 {
        let req = FindCoordinatorRequest::decode(body, version).expect("FindCoordinator");
        r.coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let mut c = Coordinator::default();
                c.key = key;
                c.node_id = BrokerId(1);
                c.host = StrBytes::from_string(addr.ip().to_string());
                c.port = addr.port() as i32;
                c
            })
            .collect();
    } else {
        r.node_id = BrokerId(1);
        r.host = StrBytes::from_string(addr.ip().to_string());
        r.port = addr.port() as i32;
    }
    encode(&r, version)
}

/// A JoinGroup answered as the group's only member, `member`, which leads generation 1.
pub fn join_alone(body: &mut BytesMut, version: i16, member: &'static str) -> BytesMut {
    let req = JoinGroupRequest::decode(body, version).expect("JoinGroup");
    let protocol = req.protocols.first().expect("a protocol");
    let r = JoinGroupResponse::default()
        .with_generation_id(1)
        .with_protocol_type(Some(req.protocol_type.clone()))
        .with_protocol_name(Some(protocol.name.clone()))
        .with_leader(StrBytes::from_static_str(member))
        .with_member_id(StrBytes::from_static_str(member))
        .with_members(vec![JoinGroupResponseMember::default()
            .with_member_id(StrBytes::from_static_str(member))
            .with_metadata(protocol.metadata.clone())]);
    encode(&r, version)
}

/// A SyncGroup of the group's only member, `member`: it leads, so it gets the assignment it
/// computed for itself.
pub fn sync_alone(body: &mut BytesMut, version: i16, member: &str) -> BytesMut {
    let req = SyncGroupRequest::decode(body, version).expect("SyncGroup");
    let mine = req
        .assignments
        .iter()
        .find(|a| a.member_id.as_str() == member)
        .map(|a| a.assignment.clone())
        .unwrap_or_default();
    let r = SyncGroupResponse::default()
        .with_protocol_type(req.protocol_type.clone())
        .with_protocol_name(req.protocol_name.clone())
        .with_assignment(mine);
    encode(&r, version)
}

/// COORDINATOR_NOT_AVAILABLE (15) for every key asked, as a broker whose offsets topic has no
/// leader answers.
fn find_coordinator_refused(version: i16, body: &mut BytesMut) -> BytesMut {
    let mut r = FindCoordinatorResponse::default();
    if version >= 4 {
        let req = FindCoordinatorRequest::decode(body, version).expect("FindCoordinator");
        r.coordinators = req
            .coordinator_keys
            .into_iter()
            .map(|key| {
                let mut c = Coordinator::default();
                c.key = key;
                c.error_code = 15;
                c.node_id = BrokerId(-1);
                c.port = -1;
                c
            })
            .collect();
    } else {
        r.error_code = 15;
        r.node_id = BrokerId(-1);
        r.port = -1;
    }
    encode(&r, version)
}

pub fn encode<T: Encodable>(msg: &T, version: i16) -> BytesMut {
    let mut out = BytesMut::new();
    msg.encode(&mut out, version).unwrap();
    out
}

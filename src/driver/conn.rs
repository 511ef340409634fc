//! One broker connection: pipelined requests over a single byte stream.
//!
//! # Design
//! Two tasks own the stream, one per direction:
//!
//! ```text
//!  request() ──encode──► mpsc ──► writer task ──write_all──► socket
//!      ▲                              │ registers Pending (FIFO) before writing
//!      │ oneshot                      ▼
//!      └──────────────── reader task ◄── decode_frame ◄── socket
//! ```
//!
//! - Callers encode their own frame (so an encoding error never touches the connection) and hand
//!   it to the writer. Only the writer writes, so a caller that is cancelled at any point cannot
//!   leave half a frame on the wire: either the frame was never queued, or the writer writes all of
//!   it and the orphaned response is discarded when it arrives.
//! - Kafka answers the requests of one connection in order, so in-flight requests form a FIFO. The
//!   reader pops the oldest entry for each frame and decodes the frame for that request's API and
//!   version, checking the correlation id. A response whose id is not the oldest outstanding one,
//!   a response nobody asked for, a bad frame or an undecodable body means the byte stream can no
//!   longer be trusted.
//! - The reader and writer run independently, so a broker that stops reading while it still has
//!   responses to send cannot deadlock us.
//! - Each in-flight entry carries its deadline, and a third task (the expiry task) fails the
//!   connection when one passes. The caller's own timer cannot do that alone: a caller that is
//!   dropped takes its timer with it, and its entry would then wait forever on a broker that
//!   never answers. The caller keeps a timer too, for the time its request waits to be queued
//!   (`Connection::request_kept` leaves that to a caller that bounds its own wait).
//!
//! The failure semantics users see are documented on [`Connection`].

use std::collections::VecDeque;
use std::io;
use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use kafka_protocol::messages::{ApiKey, ApiVersionsRequest};
use kafka_protocol::protocol::StrBytes;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::time::Instant;
use tracing::{debug, trace};

use super::dial::Dialer;

use crate::error::{Error, KafkaCode, Result};
use crate::security::{Security, SecurityError};
use crate::wire::codec::{decode_response_frame_bytes, encode_request_as, peek_correlation_id};
use crate::wire::frame::decode_frame;
use crate::wire::frame::FrameError;
use crate::wire::versions::{
    api_versions_fallback, negotiate, NegotiatedVersions, API_VERSIONS_REQUEST_VERSION,
};
use crate::wire::{Request, Response, DEFAULT_MAX_FRAME_SIZE};

/// Default bound on establishing a connection (TCP connect plus the ApiVersions handshake); the
/// Java client's `socket.connection.setup.timeout.ms` is also 10 s.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Default bound on one request, from queueing to its response; the Java client's
/// `request.timeout.ms` is also 30 s.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Requests queued for the writer beyond those being written. Callers wait (bounded by their own
/// timeout) when it is full, which keeps a stalled socket from accumulating unbounded memory.
const WRITE_QUEUE: usize = 64;

/// Encoding room a connection keeps between requests; more is given back after a large one.
pub(crate) const SCRATCH_KEPT: usize = 16 * 1024;

/// Spare read-buffer capacity kept before each read, so small responses need one allocation.
const READ_CHUNK: usize = 8 * 1024;

/// Connection settings.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnConfig {
    /// `client_id` sent in every request header (brokers log it and use it for quotas).
    /// Default: `Some("kafka-lock")`.
    pub client_id: Option<String>,
    /// Bound on TCP connect (including name resolution) plus the ApiVersions handshake.
    /// Default: [`DEFAULT_CONNECT_TIMEOUT`].
    pub connect_timeout: Duration,
    /// Bound on each request unless [`Connection::request_with_timeout`] overrides it.
    /// Default: `DEFAULT_REQUEST_TIMEOUT` (30 s).
    pub request_timeout: Duration,
    /// Largest response frame accepted; a longer length prefix poisons the connection before any
    /// of the frame is buffered. Default: [`DEFAULT_MAX_FRAME_SIZE`].
    pub max_frame_size: usize,
    /// TLS and SASL (`security.protocol` and friends). Default: plaintext.
    pub security: Security,
}

impl Default for ConnConfig {
    fn default() -> Self {
        Self {
            client_id: Some("kafka-lock".to_owned()),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
            max_frame_size: DEFAULT_MAX_FRAME_SIZE,
            security: Security::default(),
        }
    }
}

impl ConnConfig {
    /// Sets [`ConnConfig::client_id`].
    pub fn with_client_id(mut self, client_id: Option<String>) -> Self {
        self.client_id = client_id;
        self
    }

    /// Sets [`ConnConfig::connect_timeout`].
    pub fn with_connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Sets [`ConnConfig::request_timeout`].
    pub fn with_request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = timeout;
        self
    }

    /// Sets [`ConnConfig::max_frame_size`].
    pub fn with_max_frame_size(mut self, max: usize) -> Self {
        self.max_frame_size = max;
        self
    }

    /// Sets [`ConnConfig::security`].
    pub fn with_security(mut self, security: Security) -> Self {
        self.security = security;
        self
    }
}

/// A connection to one broker, with versions negotiated.
///
/// Cheap to clone; clones share the socket. Requests may be issued concurrently from any number of
/// tasks and are pipelined (several in flight on the one socket). The socket is closed when the
/// connection fails, on [`Connection::close`], or when the last clone is dropped.
///
/// Cancelling a request (dropping its future) is safe at any point: a request is either written
/// whole or not at all, and a response nobody waits for any more is read and discarded. Its
/// timeout still stands: if the broker has not answered by then, the connection closes exactly
/// as if the caller had waited.
///
/// # Failure semantics
/// The connection fails as a whole; it never recovers. Once failed, the socket is closed (both
/// tasks exit and drop their halves) and every in-flight and later request fails:
/// - framing error, decode error, correlation mismatch, unsolicited response, request timeout:
///   [`Error::Poisoned`] carrying the original error (the timed-out caller itself gets
///   [`Error::Timeout`]);
/// - the broker closing the socket or an I/O error: [`Error::Io`] describing it;
/// - [`Connection::close`] or dropping every handle: [`Error::Closed`].
///
/// A request timeout closes the connection, as the Java client and librdkafka do: the broker may
/// still send the late response, and the stream would then be one response ahead of the FIFO.
/// Requests that legitimately take long (JoinGroup blocks for up to the rebalance timeout) use
/// [`Connection::request_with_timeout`].
#[derive(Clone)]
pub struct Connection {
    current: Arc<Current>,
    versions: Arc<NegotiatedVersions>,
}

/// The link a connection's requests go to. Only a SASL connection whose session has a lifetime
/// (KIP-368) ever changes it: a renewal task authenticates a fresh link before the session ends
/// and swaps it in (see `renew`).
struct Current {
    peer: String,
    link: Mutex<Arc<Link>>,
    /// Links a renewal replaced while requests were still in flight on them: they stay open
    /// for those requests, and [`Connection::close`] must end them too. Changed only under
    /// `link`'s lock, so a close and a renewal never interleave.
    superseded: Mutex<Vec<std::sync::Weak<Link>>>,
    /// Set by [`Connection::close`] under `link`'s lock: no renewal may bring the connection
    /// back.
    closed_by_user: std::sync::atomic::AtomicBool,
    /// Renewals completed, so a test can wait for one.
    #[cfg(test)]
    renewals: watch::Sender<u64>,
}

impl Current {
    fn link(&self) -> Arc<Link> {
        Arc::clone(&self.link.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("peer", &self.current.peer)
            .field("closed", &self.is_closed())
            .finish_non_exhaustive()
    }
}

/// A link set up to the point where other requests may follow: TLS, ApiVersions and SASL done.
struct Established {
    link: Link,
    versions: NegotiatedVersions,
    /// The SASL session's lifetime, if the broker set one.
    lifetime: Option<Duration>,
}

impl Connection {
    /// Connects to `addr` (`host:port`), performs the TLS handshake and SASL authentication that
    /// [`ConnConfig::security`] asks for, and negotiates API versions. The whole setup is bounded
    /// by [`ConnConfig::connect_timeout`].
    ///
    /// When the name resolves to several addresses they are raced (RFC 8305, "Happy Eyeballs"):
    /// the next address is tried whenever the previous attempt failed or is still pending after
    /// 250 ms (less if the connect timeout is too short to start them all), and the address that
    /// worked is tried first next time. Name resolution runs on a thread of its own, so a
    /// resolver that hangs delays neither this error nor the shutdown of the tokio runtime.
    ///
    /// When SASL authentication reports a session lifetime (KIP-368, the broker's
    /// `connections.max.reauth.ms`), the connection authenticates a fresh socket at a random
    /// point between 85 % and 95 % of the lifetime and moves later requests to it; requests
    /// already in flight finish on the old socket (or fail at [`Connection::close`]), which
    /// then closes.
    pub async fn connect(addr: &str, cfg: &ConnConfig) -> Result<Connection> {
        Self::connect_via(addr, cfg, Dialer::system()).await
    }

    /// [`Connection::connect`] with the resolver and address memory of `dialer`.
    pub(crate) async fn connect_via(
        addr: &str,
        cfg: &ConnConfig,
        dialer: &Dialer,
    ) -> Result<Connection> {
        let started = Instant::now();
        let established = establish(addr, cfg, dialer).await?;
        let lifetime = established.lifetime;
        let conn = Connection::new(established.link, addr, established.versions);
        if let Some(lifetime) = lifetime {
            tokio::spawn(renew(
                Arc::downgrade(&conn.current),
                Arc::clone(&conn.versions),
                addr.to_owned(),
                cfg.clone(),
                started,
                lifetime,
            ));
        }
        Ok(conn)
    }

    fn new(link: Link, peer: &str, versions: NegotiatedVersions) -> Connection {
        Connection {
            current: Arc::new(Current {
                peer: peer.to_owned(),
                link: Mutex::new(Arc::new(link)),
                superseded: Mutex::new(Vec::new()),
                closed_by_user: std::sync::atomic::AtomicBool::new(false),
                #[cfg(test)]
                renewals: watch::channel(0).0,
            }),
            versions: Arc::new(versions),
        }
    }

    /// Runs the connection over an already established byte stream (the transport boundary for
    /// TLS or other wrappers): spawns the reader and writer tasks on the current tokio runtime
    /// (so it must be called from within one), performs the ApiVersions handshake (KIP-511)
    /// and, if [`ConnConfig::security`] has SASL credentials, the SASL exchange, each of its
    /// requests bounded by [`ConnConfig::request_timeout`]. The stream is not wrapped in TLS
    /// here, and a SASL session with a lifetime is not renewed (there is no address to dial).
    ///
    /// `peer` only names the broker in errors and logs.
    pub async fn from_stream<S>(stream: S, peer: &str, cfg: &ConnConfig) -> Result<Connection>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let established = set_up(stream, peer, cfg).await?;
        Ok(Connection::new(
            established.link,
            peer,
            established.versions,
        ))
    }

    /// The versions negotiated with this broker.
    pub fn versions(&self) -> &NegotiatedVersions {
        &self.versions
    }

    /// The broker address this connection was opened to.
    pub fn peer(&self) -> &str {
        &self.current.peer
    }

    /// Sends `req` at the negotiated version and waits for its response, bounded by
    /// [`ConnConfig::request_timeout`].
    ///
    /// A Kafka error code inside the response is not an error here; the caller interprets it.
    pub async fn request(&self, req: impl Into<Request>) -> Result<Response> {
        let link = self.current.link();
        let timeout = link.request_timeout;
        self.request_with_timeout(req, timeout).await
    }

    /// Like [`Connection::request`] with a timeout for this request only, for requests the broker
    /// holds on purpose (JoinGroup: up to the rebalance timeout; allow a few seconds more).
    ///
    /// If the timeout expires the connection is closed (see
    /// [failure semantics](Connection#failure-semantics)).
    pub async fn request_with_timeout(
        &self,
        req: impl Into<Request>,
        timeout: Duration,
    ) -> Result<Response> {
        let req = req.into();
        let api = req.api_key();
        let version = self.versions.get(api).ok_or(Error::UnsupportedApi {
            api: crate::api::Api::of(api),
        })?;
        self.current.link().call(&req, version, timeout).await
    }

    /// Like [`Connection::request_with_timeout`] at an explicit `version`, for callers that built
    /// the request for that version (the membership machine does: fields differ between
    /// versions). The version must lie within what this connection negotiated.
    pub async fn request_at(
        &self,
        req: impl Into<Request>,
        version: i16,
        timeout: Duration,
    ) -> Result<Response> {
        let req = req.into();
        let api = req.api_key();
        self.check_version(api, version)?;
        self.current.link().call(&req, version, timeout).await
    }

    /// Refuses a version the broker did not offer for `api` on this connection.
    fn check_version(&self, api: ApiKey, version: i16) -> Result<()> {
        match self.versions.get(api) {
            Some(max) if version <= max && version >= 0 => Ok(()),
            _ => Err(Error::UnsupportedApi {
                api: crate::api::Api::of(api),
            }),
        }
    }

    /// Like [`Connection::request_at`] for a caller that bounds its own wait, shorter than
    /// `keep`: the request is registered with the deadline `keep`, past which the connection
    /// fails as usual, and no timer runs for it here. A caller that gives up first leaves the
    /// connection open: a request not yet written is never sent, and the answer of one already
    /// written is read and dropped when it comes (before `keep`, or the connection fails).
    /// Saves a held Heartbeat the timer [`Connection::request_at`] would arm for `keep`.
    pub(crate) async fn request_kept(
        &self,
        req: &Request,
        version: i16,
        keep: Duration,
    ) -> Result<Response> {
        let api = req.api_key();
        self.check_version(api, version)?;
        let link = self.current.link();
        let (exchange, _, _) = link.queue(req, version, keep)?;
        exchange.await
    }

    /// Closes the connection: in-flight and later requests fail with [`Error::Closed`]. Idempotent.
    pub fn close(&self) {
        // Under the link's lock, so a renewal either swapped before (and its superseded link is
        // listed) or sees the flag and drops its fresh link.
        let (link, superseded) = {
            let link = self.current.link.lock().unwrap_or_else(|e| e.into_inner());
            self.current
                .closed_by_user
                .store(true, std::sync::atomic::Ordering::Release);
            let superseded = std::mem::take(
                &mut *self
                    .current
                    .superseded
                    .lock()
                    .unwrap_or_else(|e| e.into_inner()),
            );
            (Arc::clone(&link), superseded)
        };
        // A request still in flight on a link a KIP-368 renewal replaced would otherwise wait
        // there for its answer or its timeout, after the holder was told everything stopped.
        for old in superseded.iter().filter_map(std::sync::Weak::upgrade) {
            old.shared.fail(Arc::new(Error::Closed));
        }
        link.shared.fail(Arc::new(Error::Closed));
    }

    /// Whether `self` and `other` are handles of the same connection.
    pub(crate) fn same(&self, other: &Connection) -> bool {
        Arc::ptr_eq(&self.current, &other.current)
    }

    /// Whether the connection has failed or been closed; a closed connection never reopens.
    pub fn is_closed(&self) -> bool {
        self.current.link().shared.failure().is_some()
    }

    /// Completes once the connection has failed or been closed, e.g. to start reconnecting
    /// without waiting for the next request to fail.
    pub async fn closed(&self) {
        loop {
            let link = self.current.link();
            let mut rx = link.shared.shutdown.subscribe();
            // The sender lives in `Shared`, which `link` keeps alive, so this cannot error.
            let _ = rx.wait_for(|closed| *closed).await;
            // A renewal replaced the link and the old one closed behind it: the connection
            // lives on.
            if Arc::ptr_eq(&link, &self.current.link()) {
                return;
            }
        }
    }

    /// Completes once `n` KIP-368 renewals have swapped a fresh link in.
    #[cfg(test)]
    pub(crate) async fn renewed(&self, n: u64) {
        let mut rx = self.current.renewals.subscribe();
        let _ = rx.wait_for(|&done| done >= n).await;
    }

    /// Room the connection keeps for encoding its next request.
    #[cfg(test)]
    pub(crate) fn scratch_capacity(&self) -> usize {
        let link = self.current.link();
        let scratch = link.scratch.lock().unwrap_or_else(|e| e.into_inner());
        scratch.capacity()
    }

    /// Leaves `junk` in the encoding room and poisons its lock, as an encode that panicked
    /// midway would.
    #[cfg(test)]
    pub(crate) fn spoil_scratch(&self, junk: &[u8]) {
        let link = self.current.link();
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut scratch = link.scratch.lock().unwrap_or_else(|e| e.into_inner());
            scratch.extend_from_slice(junk);
            panic!("an encode panicked midway");
        }));
    }

    /// Requests registered and not yet answered or failed.
    #[cfg(test)]
    pub(crate) fn in_flight(&self) -> usize {
        self.current.link().shared.lock().inflight.len()
    }
}

/// Dials `addr` and sets up a link over it, all within the connect timeout.
async fn establish(addr: &str, cfg: &ConnConfig, dialer: &Dialer) -> Result<Established> {
    let setup = async {
        let tcp = dialer.connect(addr, cfg.connect_timeout).await?;
        if cfg.security.protocol.uses_tls() {
            #[cfg(any(feature = "tls", feature = "tls-graviola"))]
            {
                let default = crate::security::Tls::new();
                let tls = cfg.security.tls.as_ref().unwrap_or(&default);
                let stream = super::secure::tls_connect(tcp, addr, tls).await?;
                return set_up(stream, addr, cfg)
                    .await
                    .map_err(|e| refused_after_handshake(e, addr, tls));
            }
            #[cfg(not(any(feature = "tls", feature = "tls-graviola")))]
            {
                drop(tcp);
                return Err(Error::Config(format!(
                    "security.protocol={} needs TLS, and this build of kafka-lock has no TLS \
                     (the `tls` or `tls-graviola` cargo feature)",
                    cfg.security.protocol
                )));
            }
        }
        set_up(tcp, addr, cfg)
            .await
            .map_err(|e| tls_listener_hint(e, addr))
    };
    match tokio::time::timeout(cfg.connect_timeout, setup).await {
        Ok(result) => result,
        Err(_) => Err(Error::Timeout {
            op: format!("connecting to broker {addr}"),
            after: cfg.connect_timeout,
        }),
    }
}

/// In TLS 1.3 the client finishes its handshake before the server has checked the client's
/// certificate, so a broker that requires one (`ssl.client.auth=required`) and got none, or one
/// it does not trust, answers the first request with a fatal alert instead. The reader reports it
/// as an I/O error carrying rustls's text ("received fatal alert: ...").
#[cfg(any(feature = "tls", feature = "tls-graviola"))]
fn refused_after_handshake(e: Error, addr: &str, tls: &crate::security::Tls) -> Error {
    let text = match &e {
        Error::Io { source, .. } => source.to_string(),
        Error::Poisoned(inner) => inner.to_string(),
        _ => return e,
    };
    let Some(at) = text.find("received fatal alert: ") else {
        return e;
    };
    let alert = &text[at + "received fatal alert: ".len()..];
    let hint = if tls.client_cert.is_none() {
        "the broker probably requires a client certificate: set ssl.certificate.location and \
         ssl.key.location"
    } else {
        "the broker probably does not accept the client certificate: check that its CA \
         (the broker's ssl.truststore) signed it"
    };
    Error::Security(SecurityError::Tls {
        broker: addr.to_owned(),
        detail: format!("the broker ended the session with the alert {alert}; {hint}"),
    })
}

/// The first answer of a plaintext connection tells a TLS listener apart: it sends a TLS alert
/// record (content type 21, version 3.x) where a Kafka frame's length should be.
fn tls_listener_hint(e: Error, addr: &str) -> Error {
    let looks_tls = |size: u32| {
        let b = size.to_be_bytes();
        (b[0] == 0x15 || b[0] == 0x16) && b[1] == 0x03
    };
    let frame = match &e {
        Error::Poisoned(inner) => match &**inner {
            Error::Frame(f) => Some(f.clone()),
            Error::Decode(crate::wire::codec::DecodeError::Frame(f)) => Some(f.clone()),
            _ => None,
        },
        Error::Frame(f) => Some(f.clone()),
        _ => None,
    };
    match frame {
        Some(FrameError::TooLarge { size, .. }) if looks_tls(size as u32) => {
            Error::Security(SecurityError::TlsListener {
                broker: addr.to_owned(),
            })
        }
        _ => e,
    }
}

/// ApiVersions, then SASL if configured, over `stream`.
async fn set_up<S>(stream: S, peer: &str, cfg: &ConnConfig) -> Result<Established>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let link = Link::spawn(stream, peer, cfg);
    let versions = handshake(&link, cfg.request_timeout).await?;
    let mut lifetime = None;
    if cfg.security.protocol.uses_sasl() {
        let Some(sasl) = &cfg.security.sasl else {
            return Err(Error::Config(format!(
                "security.protocol={} needs SASL credentials",
                cfg.security.protocol
            )));
        };
        let authenticated = super::secure::authenticate(
            &SetupLink(&link, cfg.request_timeout),
            &versions,
            sasl,
            peer,
        )
        .await?;
        lifetime = authenticated.lifetime;
    }
    debug!(peer, ?versions, "connected");
    Ok(Established {
        link,
        versions,
        lifetime,
    })
}

/// The link being set up, as the SASL exchange sees it.
struct SetupLink<'a>(&'a Link, Duration);

impl super::secure::Exchange for SetupLink<'_> {
    async fn exchange(&self, req: Request, version: i16) -> Result<Response> {
        self.0.call(&req, version, self.1).await
    }
}

/// KIP-368 re-authentication by replacement: sleeps until a random point between 85 % and 95 %
/// of the session's lifetime (as Apache's client picks its re-authentication time), or earlier
/// when twice the last setup's duration would not fit before the deadline, sets up a
/// fresh link (TCP, TLS, ApiVersions, SASL) and swaps it in. The requests in flight on the old
/// link finish there, within their deadlines, and the old link closes once the last one is done;
/// no request ever waits for the renewal. Ends when the connection is dropped or has failed.
///
/// If no fresh link can be set up before the session ends, the old one is left as it is: the
/// broker closes it at its first request after the deadline, and the caller reconnects as after
/// any other connection failure.
async fn renew(
    current: std::sync::Weak<Current>,
    versions: Arc<NegotiatedVersions>,
    addr: String,
    cfg: ConnConfig,
    mut started: Instant,
    mut lifetime: Duration,
) {
    const RETRY: Duration = Duration::from_millis(200);
    // How long the last setup took: a renewal starts at least twice that before the deadline.
    let mut setup = started.elapsed();
    loop {
        let fraction = 0.85 + 0.10 * super::secure::unit_random();
        // `started` is before the broker's own clock for the session began (it starts when
        // authentication completes), so deadlines counted from it are early, never late.
        let expires = started + lifetime;
        let due = (started + lifetime.mul_f64(fraction))
            .min(expires.checked_sub(setup * 2).unwrap_or(started))
            .max(started);
        let watched = match current.upgrade() {
            Some(c) => c.link(),
            None => return,
        };
        let mut shutdown = watched.shared.shutdown.subscribe();
        drop(watched);
        tokio::select! {
            _ = shutdown.wait_for(|closed| *closed) => return,
            () = tokio::time::sleep_until(due) => {}
        }
        loop {
            let attempt = Instant::now();
            let result = establish(&addr, &cfg, Dialer::system()).await;
            let Some(conn) = current.upgrade() else {
                return;
            };
            if conn.link().shared.failure().is_some()
                || conn
                    .closed_by_user
                    .load(std::sync::atomic::Ordering::Acquire)
            {
                return;
            }
            match result {
                Ok(fresh) if fresh.versions == *versions => {
                    let old = {
                        let mut link = conn.link.lock().unwrap_or_else(|e| e.into_inner());
                        // Checked again under the lock `close` takes: a close since the check
                        // above must not be undone by swapping a live link in. The fresh link
                        // closes as it is dropped.
                        if link.shared.failure().is_some()
                            || conn
                                .closed_by_user
                                .load(std::sync::atomic::Ordering::Acquire)
                        {
                            return;
                        }
                        let old = std::mem::replace(&mut *link, Arc::new(fresh.link));
                        let mut superseded =
                            conn.superseded.lock().unwrap_or_else(|e| e.into_inner());
                        superseded.retain(|l| l.strong_count() > 0);
                        superseded.push(Arc::downgrade(&old));
                        old
                    };
                    debug!(peer = %addr, "SASL session renewed on a fresh connection (KIP-368)");
                    #[cfg(test)]
                    conn.renewals.send_modify(|n| *n += 1);
                    drop(old);
                    started = attempt;
                    setup = attempt.elapsed();
                    match fresh.lifetime {
                        Some(l) => lifetime = l,
                        None => return,
                    }
                    break;
                }
                Ok(_) => {
                    debug!(peer = %addr, "the fresh connection negotiated other API versions; keeping the old one until the broker closes it");
                    return;
                }
                Err(e) => {
                    debug!(peer = %addr, error = %e, "renewing the SASL session failed");
                    if Instant::now() + RETRY >= expires {
                        return;
                    }
                    drop(conn);
                    tokio::time::sleep(RETRY).await;
                }
            }
        }
    }
}

/// ApiVersions with the KIP-511 fallback, then per-API negotiation.
async fn handshake(link: &Link, timeout: Duration) -> Result<NegotiatedVersions> {
    let req: Request = ApiVersionsRequest::default()
        .with_client_software_name(StrBytes::from_static_str("kafka-lock"))
        .with_client_software_version(StrBytes::from_static_str(env!("CARGO_PKG_VERSION")))
        .into();
    let mut version = API_VERSIONS_REQUEST_VERSION;
    loop {
        let resp = match link.call(&req, version, timeout).await? {
            Response::ApiVersions(resp) => resp,
            other => {
                // decode_response_frame decodes for the API we asked for; anything else is a
                // bug in that layer, reported rather than trusted.
                return Err(Error::Protocol(format!(
                    "asked {} for ApiVersions, decoded a {:?} response",
                    link.peer,
                    other.api_key()
                )));
            }
        };
        if resp.error_code == KafkaCode::UNSUPPORTED_VERSION.code() {
            // The broker lists the ApiVersions versions it supports. Only ever step down, so a
            // confused broker that keeps answering 35 cannot keep us looping.
            match api_versions_fallback(&resp) {
                Some(lower) if lower < version => {
                    debug!(peer = %link.peer, from = version, to = lower, "ApiVersions fallback");
                    version = lower;
                    continue;
                }
                _ => {}
            }
        }
        if resp.error_code != 0 {
            return Err(Error::broker(
                ApiKey::ApiVersions,
                KafkaCode(resp.error_code),
                None,
            ));
        }
        return negotiate(&resp).map_err(Error::from);
    }
}

/// What the writer needs to put one request on the wire and route its response.
struct Outgoing {
    frame: Bytes,
    pending: Pending,
}

/// An in-flight request, waiting for its response.
struct Pending {
    correlation_id: i32,
    api_key: ApiKey,
    version: i16,
    /// When the connection gives up on the response; `None` for a timeout beyond what `Instant`
    /// can represent.
    deadline: Option<Instant>,
    /// The timeout `deadline` came from, for the error.
    timeout: Duration,
    reply: oneshot::Sender<Result<Response>>,
}

/// State shared by the handles and both I/O tasks.
struct Shared {
    peer: String,
    state: Mutex<State>,
    /// Flips to `true` once, when the connection fails; all three tasks exit on it.
    shutdown: watch::Sender<bool>,
    /// Wakes the expiry task when a request is registered, so it can arm for an earlier
    /// deadline.
    registered: Notify,
}

#[derive(Default)]
struct State {
    /// Requests written (or being written) in wire order; Kafka answers in this order.
    inflight: VecDeque<Pending>,
    /// Why the connection is dead; `None` while it is usable.
    failure: Option<Arc<Error>>,
    /// The deadline the expiry task sleeps until (`None`: it waits for a registration). A
    /// request due no earlier needs no wake-up: the task looks at every entry when it wakes.
    /// Requests of one kind share a timeout, so this spares the task a wake-up per request.
    armed: Option<Instant>,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        // No code panics while holding the lock, but a poisoned mutex must not take the
        // connection down with a second panic either: the state is still consistent.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn failure(&self) -> Option<Arc<Error>> {
        self.lock().failure.clone()
    }

    /// The error a request sees on a connection that failed for `reason`.
    fn error_for(reason: &Arc<Error>) -> Error {
        match &**reason {
            Error::Closed => Error::Closed,
            // io::Error is not Clone; each request gets an equivalent one.
            Error::Io { op, source } => Error::Io {
                op,
                source: io::Error::new(source.kind(), source.to_string()),
            },
            _ => Error::Poisoned(Arc::clone(reason)),
        }
    }

    /// The error for a request whose reply channel was dropped, which only happens once the
    /// connection has failed.
    fn current_error(&self) -> Error {
        match self.failure() {
            Some(reason) => Self::error_for(&reason),
            None => Error::Closed,
        }
    }

    /// Fails the connection for `reason` unless it already failed: every in-flight request gets
    /// the matching error and both I/O tasks stop, closing the socket.
    fn fail(&self, reason: Arc<Error>) {
        let drained = {
            let mut state = self.lock();
            if state.failure.is_some() {
                return;
            }
            state.failure = Some(Arc::clone(&reason));
            std::mem::take(&mut state.inflight)
        };
        self.finish_failure(&reason, drained);
    }

    /// Answers what was in flight when the connection failed and stops the I/O tasks.
    fn finish_failure(&self, reason: &Arc<Error>, drained: VecDeque<Pending>) {
        debug!(peer = %self.peer, error = %reason, in_flight = drained.len(), "connection closed");
        for p in drained {
            let _ = p.reply.send(Err(Self::error_for(reason)));
        }
        self.shutdown.send_replace(true);
    }

    /// The earliest deadline of an in-flight request, which the expiry task arms for.
    fn arm_next_deadline(&self) -> Option<Instant> {
        let mut state = self.lock();
        let next = state.inflight.iter().filter_map(|p| p.deadline).min();
        state.armed = next;
        next
    }

    /// Fails the connection if an in-flight request is past its deadline, whether or not its
    /// caller still waits: the broker may still answer it, and the stream would then be one
    /// response ahead of the FIFO if the entry were simply dropped.
    fn expire(&self, now: Instant) {
        let (expired, own_error, reason, drained) = {
            let mut state = self.lock();
            if state.failure.is_some() {
                return;
            }
            let due = state
                .inflight
                .iter()
                .position(|p| p.deadline.is_some_and(|d| d <= now));
            let Some(expired) = due.and_then(|i| state.inflight.remove(i)) else {
                return;
            };
            let op = request_op(
                expired.api_key,
                expired.version,
                &self.peer,
                expired.correlation_id,
            );
            let after = expired.timeout;
            let reason = Arc::new(Error::Timeout {
                op: op.clone(),
                after,
            });
            // Failed under the same lock that removed the entry, so the reader can never match
            // the late response to the entry behind it.
            state.failure = Some(Arc::clone(&reason));
            let drained = std::mem::take(&mut state.inflight);
            (expired, Error::Timeout { op, after }, reason, drained)
        };
        // Its caller, if still there, hears of its own timeout as such, exactly as when its own
        // timer fires first; the others see the connection poisoned by it.
        let _ = expired.reply.send(Err(own_error));
        self.finish_failure(&reason, drained);
    }

    /// Registers `pending` as the newest in-flight request; answers it at once if the connection
    /// already failed. Returns whether it was registered.
    fn register(&self, pending: Pending) -> bool {
        let mut state = self.lock();
        if let Some(reason) = &state.failure {
            let err = Self::error_for(reason);
            drop(state);
            let _ = pending.reply.send(Err(err));
            return false;
        }
        let sooner = match (pending.deadline, state.armed) {
            (Some(due), Some(armed)) => due < armed,
            (due, _) => due.is_some(),
        };
        state.inflight.push_back(pending);
        drop(state);
        if sooner {
            self.registered.notify_one();
        }
        true
    }

    /// Routes one response frame to the oldest in-flight request. An error return is the reason
    /// to fail the connection.
    fn deliver(&self, frame: Bytes) -> std::result::Result<(), Arc<Error>> {
        let pending = {
            let mut state = self.lock();
            if state.failure.is_some() {
                return Ok(());
            }
            state.inflight.pop_front()
        };
        let Some(p) = pending else {
            let id =
                peek_correlation_id(&frame).map_or_else(|| "none".to_owned(), |id| id.to_string());
            return Err(Arc::new(Error::Protocol(format!(
                "{} sent a response (correlation id {id}) while no request was in flight",
                self.peer
            ))));
        };
        match decode_response_frame_bytes(frame, p.api_key, p.version, p.correlation_id) {
            Ok(resp) => {
                trace!(peer = %self.peer, api = ?p.api_key, correlation_id = p.correlation_id, "response");
                // The caller may have gone (cancelled); its response is simply discarded.
                let _ = p.reply.send(Ok(resp));
                Ok(())
            }
            Err(e) => {
                let reason = Arc::new(Error::from(e));
                let _ = p.reply.send(Err(Error::Poisoned(Arc::clone(&reason))));
                Err(reason)
            }
        }
    }
}

/// The request path shared by every handle: correlation ids, the writer queue, timeouts.
struct Link {
    peer: String,
    client_id: Option<StrBytes>,
    request_timeout: Duration,
    next_correlation_id: AtomicI32,
    /// Where requests are encoded. Each frame is split off and sent; once the writer has
    /// dropped the frames, the next encode reuses their room instead of allocating (a held lock
    /// sends a Heartbeat every interval, and a client may hold thousands).
    scratch: Mutex<BytesMut>,
    tx: mpsc::Sender<Outgoing>,
    shared: Arc<Shared>,
}

impl Link {
    fn spawn<S>(stream: S, peer: &str, cfg: &ConnConfig) -> Link
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (shutdown, _) = watch::channel(false);
        let shared = Arc::new(Shared {
            peer: peer.to_owned(),
            state: Mutex::new(State::default()),
            shutdown,
            registered: Notify::new(),
        });
        let (tx, rx) = mpsc::channel(WRITE_QUEUE);
        let (reader, writer) = tokio::io::split(stream);
        tokio::spawn(write_loop(writer, rx, Arc::clone(&shared)));
        tokio::spawn(read_loop(reader, Arc::clone(&shared), cfg.max_frame_size));
        tokio::spawn(expire_loop(Arc::clone(&shared)));
        Link {
            peer: peer.to_owned(),
            client_id: cfg.client_id.clone().map(StrBytes::from_string),
            request_timeout: cfg.request_timeout,
            next_correlation_id: AtomicI32::new(0),
            scratch: Mutex::new(BytesMut::new()),
            tx,
            shared,
        }
    }

    async fn call(&self, req: &Request, version: i16, timeout: Duration) -> Result<Response> {
        let (exchange, deadline, correlation_id) = self.queue(req, version, timeout)?;
        // The expiry task enforces the same deadline once the request is registered; this timer
        // also covers the wait for room in the writer's queue, before registration.
        let result = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, exchange).await,
            None => Ok(exchange.await),
        };
        match result {
            Ok(result) => result,
            Err(_) => {
                let op = request_op(req.api_key(), version, &self.peer, correlation_id);
                self.shared.fail(Arc::new(Error::Timeout {
                    op: op.clone(),
                    after: timeout,
                }));
                Err(Error::Timeout { op, after: timeout })
            }
        }
    }

    /// Encodes `req` and returns the exchange that queues it for the writer and waits for its
    /// answer, with no timer of its own: once registered, the expiry task fails the connection
    /// at `timeout`; before that, only the caller's own bound ends the wait.
    fn queue(
        &self,
        req: &Request,
        version: i16,
        timeout: Duration,
    ) -> Result<(
        impl std::future::Future<Output = Result<Response>> + '_,
        Option<Instant>,
        i32,
    )> {
        if let Some(reason) = self.shared.failure() {
            return Err(Shared::error_for(&reason));
        }
        let api_key = req.api_key();
        // Ids only need to be unique among in-flight requests; wrapping after 2^32 is fine.
        let correlation_id = self.next_correlation_id.fetch_add(1, Ordering::Relaxed);
        let frame = {
            let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
            // Every frame is split off whole, so the scratch holds bytes only if an encode
            // panicked midway under the lock: sent ahead of this frame, they would desynchronise
            // the connection for every lock sharing it.
            scratch.clear();
            // On error the scratch is left as it was.
            encode_request_as(
                req,
                version,
                correlation_id,
                self.client_id.clone(),
                &mut scratch,
            )?;
            let frame = scratch.split().freeze();
            // A large request (a Produce with a big checkpoint) would otherwise leave its room
            // with the connection for good: the scratch lets go of it, and it is freed with the
            // frame.
            if frame.len() > SCRATCH_KEPT {
                *scratch = BytesMut::new();
            }
            frame
        };
        let (reply, rx) = oneshot::channel();
        // `None` (a timeout too long for `Instant`) means no deadline rather than a panic.
        let deadline = Instant::now().checked_add(timeout);
        let out = Outgoing {
            frame,
            pending: Pending {
                correlation_id,
                api_key,
                version,
                deadline,
                timeout,
                reply,
            },
        };
        trace!(peer = %self.peer, api = ?api_key, version, correlation_id, "request");
        // Queued at once when the writer has room, as it nearly always has: the future then
        // only waits for the answer, and stays small (a Heartbeat's is allocated for each).
        let full = match self.tx.try_send(out) {
            Ok(()) => None,
            Err(mpsc::error::TrySendError::Full(out)) => Some(out),
            Err(mpsc::error::TrySendError::Closed(_)) => return Err(self.shared.current_error()),
        };
        let exchange = async move {
            if let Some(out) = full {
                Box::pin(self.tx.send(out))
                    .await
                    .map_err(|_| self.shared.current_error())?;
            }
            rx.await.map_err(|_| self.shared.current_error())?
        };
        Ok((exchange, deadline, correlation_id))
    }
}

/// Names a request in timeout errors.
fn request_op(api_key: ApiKey, version: i16, peer: &str, correlation_id: i32) -> String {
    format!("{api_key:?} v{version} request to {peer} (correlation id {correlation_id})")
}

impl Drop for Link {
    fn drop(&mut self) {
        // Dropping `tx` ends the writer, which fails the connection with `Closed`; doing it here
        // as well makes the close immediate instead of depending on task scheduling.
        self.shared.fail(Arc::new(Error::Closed));
    }
}

async fn write_loop<W>(mut w: W, mut rx: mpsc::Receiver<Outgoing>, shared: Arc<Shared>)
where
    W: AsyncWrite + Unpin,
{
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        let out = tokio::select! {
            biased;
            _ = shutdown.wait_for(|closed| *closed) => break,
            msg = rx.recv() => match msg {
                Some(out) => out,
                None => {
                    shared.fail(Arc::new(Error::Closed));
                    break;
                }
            },
        };
        // The caller gave up while the request was queued: nothing is on the wire yet, so
        // not sending it at all is both safe and what the caller asked for.
        if out.pending.reply.is_closed() {
            continue;
        }
        // Register before writing: the response can arrive before write_all returns.
        if !shared.register(out.pending) {
            continue;
        }
        let written = tokio::select! {
            biased;
            _ = shutdown.wait_for(|closed| *closed) => break,
            r = async {
                w.write_all(&out.frame).await?;
                // A no-op for TCP; wrappers such as TLS buffer until flushed.
                w.flush().await
            } => r,
        };
        if let Err(e) = written {
            shared.fail(Arc::new(Error::Io {
                op: "write request",
                source: io::Error::new(e.kind(), format!("to {}: {e}", shared.peer)),
            }));
            break;
        }
    }
    // Requests still queued get their reply channels dropped, which their callers map to the
    // connection's failure.
    rx.close();
}

async fn read_loop<R>(mut r: R, shared: Arc<Shared>, max_frame_size: usize)
where
    R: AsyncRead + Unpin,
{
    let mut shutdown = shared.shutdown.subscribe();
    let mut buf = BytesMut::with_capacity(READ_CHUNK);
    loop {
        loop {
            match decode_frame(&mut buf, max_frame_size) {
                Ok(Some(frame)) => {
                    if let Err(reason) = shared.deliver(frame) {
                        shared.fail(reason);
                        return;
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    shared.fail(Arc::new(Error::from(e)));
                    return;
                }
            }
        }
        if buf.capacity() - buf.len() < READ_CHUNK {
            buf.reserve(READ_CHUNK);
        }
        let read = tokio::select! {
            biased;
            _ = shutdown.wait_for(|closed| *closed) => return,
            r = r.read_buf(&mut buf) => r,
        };
        let err = match read {
            Ok(0) => {
                let in_flight = shared.lock().inflight.len();
                let msg = if buf.is_empty() {
                    format!(
                        "broker {} closed the connection ({in_flight} request(s) in flight)",
                        shared.peer
                    )
                } else {
                    format!(
                        "broker {} closed the connection in the middle of a response frame \
                         ({} byte(s) of it received, {in_flight} request(s) in flight)",
                        shared.peer,
                        buf.len()
                    )
                };
                io::Error::new(io::ErrorKind::UnexpectedEof, msg)
            }
            Ok(_) => continue,
            Err(e) => io::Error::new(e.kind(), format!("from {}: {e}", shared.peer)),
        };
        shared.fail(Arc::new(Error::Io {
            op: "read response",
            source: err,
        }));
        return;
    }
}

/// Enforces in-flight deadlines (see the module docs for why not only in the caller).
async fn expire_loop(shared: Arc<Shared>) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        // Answered entries leave no trace here, so this can wake for a deadline that no longer
        // exists; `expire` then finds nothing due and the next turn re-arms.
        let next = shared.arm_next_deadline();
        tokio::select! {
            biased;
            _ = shutdown.wait_for(|closed| *closed) => return,
            () = shared.registered.notified() => {}
            () = sleep_until(next) => shared.expire(Instant::now()),
        }
    }
}

async fn sleep_until(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

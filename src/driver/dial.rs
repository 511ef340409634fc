//! From `host:port` to a TCP stream: name resolution that cannot hold the runtime, and staggered
//! attempts over every resolved address (Happy Eyeballs, RFC 8305).
//!
//! - **Resolution runs on a detached thread of its own.** The system resolver blocks, and tokio's
//!   `lookup_host` runs it on the runtime's blocking pool, which a runtime waits for when it is
//!   dropped: one hanging lookup then holds the process's exit for as long as the resolver takes.
//!   A detached thread is never waited for; the caller stops listening when its connect timeout
//!   ends and the thread finishes (or not) on its own. [`MAX_PENDING_LOOKUPS`] bounds how many
//!   such threads a resolver that never answers can accumulate.
//! - **Addresses are raced, not queued.** A name often resolves to an IPv6 and an IPv4 address; if
//!   the first one black-holes (SYNs dropped, no answer), trying addresses one after another would
//!   spend the whole connect timeout on it. Instead the next address is started whenever the
//!   previous attempt fails or has been pending for the attempt delay, with earlier attempts kept
//!   running; the first to connect wins. Families alternate so one broken family costs one delay.
//! - **What worked is tried first next time**, so a reconnect to a dual-stack name whose first
//!   address is broken does not pay the attempt delay again.

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinSet;
use tracing::trace;

use crate::error::{Error, Result};

/// RFC 8305's recommended Connection Attempt Delay: how long an attempt runs alone before the
/// next address is tried alongside it.
const ATTEMPT_DELAY: Duration = Duration::from_millis(250);

/// RFC 8305's floor on that delay: below it, racing turns into flooding every address at once.
const MIN_ATTEMPT_DELAY: Duration = Duration::from_millis(10);

/// Lookups that may be outstanding at once. A resolver that never answers leaves one thread per
/// abandoned lookup; past this many, connecting fails at once instead of adding another.
pub(crate) const MAX_PENDING_LOOKUPS: usize = 16;

/// Names remembered with the address that last worked; the map is cleared when it grows past
/// this, which only costs one attempt delay per name the next time.
const MAX_REMEMBERED: usize = 256;

/// A blocking `host:port` lookup, as the system resolver does it.
pub(crate) type Resolve = dyn Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync;

/// Resolves and connects; one process-wide instance ([`Dialer::system`]) serves every
/// connection, tests make their own with a scripted resolver.
pub(crate) struct Dialer {
    resolve: Arc<Resolve>,
    /// Per `host:port`, the resolved address the last successful connection used.
    preferred: Mutex<HashMap<String, SocketAddr>>,
    /// Lookup threads still running, whether or not anyone still waits for them.
    lookups: Arc<AtomicUsize>,
}

static SYSTEM: LazyLock<Dialer> =
    LazyLock::new(|| Dialer::new(|addr| addr.to_socket_addrs().map(Iterator::collect)));

/// Gives its lookup slot back however the lookup thread ends, panics included.
struct LookupSlot(Arc<AtomicUsize>);

impl Drop for LookupSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Dialer {
    pub(crate) fn new(
        resolve: impl Fn(&str) -> io::Result<Vec<SocketAddr>> + Send + Sync + 'static,
    ) -> Dialer {
        Dialer {
            resolve: Arc::new(resolve),
            preferred: Mutex::new(HashMap::new()),
            lookups: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// The dialer using the system resolver.
    pub(crate) fn system() -> &'static Dialer {
        &SYSTEM
    }

    /// Resolves `addr` and connects to one of its addresses. `budget` (the connect timeout) only
    /// paces the attempts so that every address is started within it; the caller bounds the
    /// whole operation.
    pub(crate) async fn connect(&self, addr: &str, budget: Duration) -> Result<TcpStream> {
        let resolved = self.resolve(addr).await?;
        let candidates = order(resolved, self.preferred(addr));
        if candidates.is_empty() {
            return Err(Error::Io {
                op: "resolve broker address",
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("{addr} resolved to no address"),
                ),
            });
        }
        let delay = attempt_delay(budget, candidates.len());
        let (winner, stream) = race(addr, &candidates, delay).await?;
        if candidates.len() > 1 {
            self.remember(addr, winner);
        }
        // Requests are small and latency-bound (heartbeats); Nagle would only delay them.
        stream.set_nodelay(true).map_err(|e| Error::Io {
            op: "set TCP_NODELAY",
            source: e,
        })?;
        trace!(addr, %winner, "tcp connected");
        Ok(stream)
    }

    async fn resolve(&self, addr: &str) -> Result<Vec<SocketAddr>> {
        let failed = |source: io::Error| Error::Io {
            op: "resolve broker address",
            source,
        };
        if let Ok(sa) = addr.parse::<SocketAddr>() {
            return Ok(vec![sa]);
        }
        // Input that cannot be a name and a port fails here rather than costing a thread.
        match addr.rsplit_once(':') {
            Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => {}
            _ => {
                return Err(failed(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{addr}: expected host:port"),
                )))
            }
        }
        if self.lookups.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING_LOOKUPS {
            self.lookups.fetch_sub(1, Ordering::AcqRel);
            return Err(failed(io::Error::new(
                io::ErrorKind::WouldBlock,
                format!(
                    "{addr}: {MAX_PENDING_LOOKUPS} earlier name lookups are still unanswered; \
                     the system resolver is not responding"
                ),
            )));
        }
        let slot = LookupSlot(Arc::clone(&self.lookups));
        let (tx, rx) = oneshot::channel();
        let resolve = Arc::clone(&self.resolve);
        let name = addr.to_owned();
        std::thread::Builder::new()
            .name("kafka-lock-resolve".to_owned())
            .spawn(move || {
                let _slot = slot;
                let _ = tx.send(resolve(&name));
            })
            .map_err(|e| failed(io::Error::new(e.kind(), format!("{addr}: {e}"))))?;
        match rx.await {
            Ok(result) => {
                result.map_err(|e| failed(io::Error::new(e.kind(), format!("{addr}: {e}"))))
            }
            Err(_) => Err(failed(io::Error::other(format!(
                "{addr}: the resolver thread panicked"
            )))),
        }
    }

    fn preferred(&self, addr: &str) -> Option<SocketAddr> {
        self.lock_preferred().get(addr).copied()
    }

    fn remember(&self, addr: &str, winner: SocketAddr) {
        let mut map = self.lock_preferred();
        if map.len() >= MAX_REMEMBERED && !map.contains_key(addr) {
            map.clear();
        }
        map.insert(addr.to_owned(), winner);
    }

    fn lock_preferred(&self) -> std::sync::MutexGuard<'_, HashMap<String, SocketAddr>> {
        // A hint cache: whatever a panicking holder left behind is still a valid hint.
        self.preferred.lock().unwrap_or_else(|e| e.into_inner())
    }

    #[cfg(test)]
    pub(crate) fn preferred_for(&self, addr: &str) -> Option<SocketAddr> {
        self.preferred(addr)
    }

    #[cfg(test)]
    pub(crate) fn pending_lookups(&self) -> usize {
        self.lookups.load(Ordering::Acquire)
    }
}

/// The order to try `resolved` in: duplicates dropped, families alternating from the resolver's
/// first choice (RFC 8305 section 4), and the address that worked last time first.
pub(crate) fn order(resolved: Vec<SocketAddr>, preferred: Option<SocketAddr>) -> Vec<SocketAddr> {
    let mut unique = Vec::with_capacity(resolved.len());
    for sa in resolved {
        if !unique.contains(&sa) {
            unique.push(sa);
        }
    }
    let Some(first) = unique.first() else {
        return unique;
    };
    let first_v6 = first.is_ipv6();
    let (mut same, mut other): (VecDeque<_>, VecDeque<_>) =
        unique.into_iter().partition(|sa| sa.is_ipv6() == first_v6);
    let mut out = Vec::with_capacity(same.len() + other.len());
    while !same.is_empty() || !other.is_empty() {
        out.extend(same.pop_front());
        out.extend(other.pop_front());
    }
    if let Some(i) = preferred.and_then(|p| out.iter().position(|&sa| sa == p)) {
        let sa = out.remove(i);
        out.insert(0, sa);
    }
    out
}

/// RFC 8305's delay, shortened when the connect timeout could not otherwise start every address.
fn attempt_delay(budget: Duration, candidates: usize) -> Duration {
    let share = budget / u32::try_from(candidates.max(1)).unwrap_or(u32::MAX);
    share.clamp(MIN_ATTEMPT_DELAY, ATTEMPT_DELAY)
}

/// Connects to the first of `candidates` that accepts, starting each next attempt when the
/// previous one failed or after `delay`. Losing attempts are aborted when this returns or is
/// dropped (the `JoinSet` owns them).
async fn race(
    addr: &str,
    candidates: &[SocketAddr],
    delay: Duration,
) -> Result<(SocketAddr, TcpStream)> {
    let mut left: VecDeque<SocketAddr> = candidates.iter().copied().collect();
    let mut running = JoinSet::new();
    let mut last: Option<io::Error> = None;
    let launch = |running: &mut JoinSet<_>, left: &mut VecDeque<SocketAddr>| {
        if let Some(sa) = left.pop_front() {
            trace!(addr, %sa, "tcp connect attempt");
            running.spawn(async move { (sa, TcpStream::connect(sa).await) });
        }
    };
    launch(&mut running, &mut left);
    let next = tokio::time::sleep(delay);
    tokio::pin!(next);
    loop {
        tokio::select! {
            biased;
            joined = running.join_next() => match joined {
                Some(Ok((sa, Ok(stream)))) => return Ok((sa, stream)),
                Some(Ok((sa, Err(e)))) => {
                    trace!(addr, %sa, error = %e, "tcp connect failed");
                    last = Some(io::Error::new(e.kind(), format!("{addr} ({sa}): {e}")));
                    // A failed attempt frees its turn: no reason to wait out the delay.
                    launch(&mut running, &mut left);
                    next.as_mut().reset(tokio::time::Instant::now() + delay);
                }
                Some(Err(e)) => {
                    last = Some(io::Error::other(format!("{addr}: connect attempt failed: {e}")));
                    launch(&mut running, &mut left);
                }
                // Nothing running and nothing left to start.
                None => break,
            },
            () = &mut next, if !left.is_empty() => {
                launch(&mut running, &mut left);
                next.as_mut().reset(tokio::time::Instant::now() + delay);
            }
        }
    }
    Err(Error::Io {
        op: "connect to broker",
        source: last.unwrap_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{addr} resolved to no address"),
            )
        }),
    })
}

//! Bootstrap: the first connection, from a list of `host:port` addresses.
//!
//! Addresses are tried in rotation from a random starting point (drawn from the [`Backoff`]'s
//! random source, so tests can fix it), which spreads many clients started together over the
//! list. After each full round that failed, the caller's [`Backoff`] decides the pause; the
//! rounds are bounded by [`BootstrapConfig::deadline`] and [`BootstrapConfig::max_rounds`]. The
//! error names every address tried with the last error seen for it.
//!
//! The first round is never cut short by the deadline: every address gets one attempt with the
//! full connect timeout. Otherwise a list that starts with unreachable brokers could use up the
//! deadline on them and report the cluster unreachable without ever trying the live broker
//! behind them.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::debug;

use super::conn::{ConnConfig, Connection};
use crate::backoff::Backoff;
pub use crate::error::{BootstrapAttempt, BootstrapError};
use crate::error::{Error, Result};

/// Bounds on [`connect_any`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct BootstrapConfig {
    /// Time budget for retrying, including the pauses between rounds. It never cuts the first
    /// round short: each address is tried once with the full connect timeout even if that takes
    /// longer than the deadline. Default: 60 s.
    pub deadline: Duration,
    /// Full rounds over the list before giving up (at least 1 is made). Default: 10.
    pub max_rounds: u32,
}

impl Default for BootstrapConfig {
    fn default() -> Self {
        Self {
            deadline: Duration::from_secs(60),
            max_rounds: 10,
        }
    }
}

impl BootstrapConfig {
    /// Sets [`BootstrapConfig::deadline`].
    pub fn with_deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Sets [`BootstrapConfig::max_rounds`].
    pub fn with_max_rounds(mut self, rounds: u32) -> Self {
        self.max_rounds = rounds;
        self
    }
}

/// Connects to one broker of `bootstrap`, trying addresses in rotation with `backoff` between full
/// rounds (it is reset on success), within `limits`. Every address is tried at least once.
///
/// An empty list is a [`Error::Config`] error; otherwise failure is [`Error::Bootstrap`].
pub async fn connect_any(
    bootstrap: &[String],
    cfg: &ConnConfig,
    backoff: &mut Backoff,
    limits: &BootstrapConfig,
) -> Result<Connection> {
    rotate(bootstrap, cfg.connect_timeout, backoff, limits, |addr| {
        Connection::connect(addr, cfg)
    })
    .await
}

/// The rotation behind [`connect_any`], over any `connect`, so its timing can be tested with
/// scripted connections on a paused clock. Each attempt is bounded by `connect_timeout`, and
/// after the first round also by the deadline.
pub(crate) async fn rotate<'a, T, F, Fut>(
    bootstrap: &'a [String],
    connect_timeout: Duration,
    backoff: &mut Backoff,
    limits: &BootstrapConfig,
    mut connect: F,
) -> Result<T>
where
    F: FnMut(&'a str) -> Fut,
    Fut: Future<Output = Result<T>>,
{
    if bootstrap.is_empty() {
        return Err(Error::Config(
            "the bootstrap broker list is empty; give at least one host:port".to_owned(),
        ));
    }
    let started = Instant::now();
    // `None`: further away than `Instant` reaches, i.e. no deadline.
    let deadline = started.checked_add(limits.deadline);
    let start = backoff.random_index(bootstrap.len());
    let mut last: Vec<Option<Error>> = bootstrap.iter().map(|_| None).collect();
    let mut rounds = 0;
    'rounds: loop {
        rounds += 1;
        for i in 0..bootstrap.len() {
            let idx = (start + i) % bootstrap.len();
            let addr = &bootstrap[idx];
            let now = Instant::now();
            let mut limit = now.checked_add(connect_timeout);
            let mut by_deadline = false;
            if let (true, Some(deadline)) = (rounds > 1, deadline) {
                if now >= deadline {
                    break 'rounds;
                }
                if limit.is_none_or(|l| deadline < l) {
                    limit = Some(deadline);
                    by_deadline = true;
                }
            }
            let attempt = connect(addr);
            let result = match limit {
                None => attempt.await,
                Some(limit) => match tokio::time::timeout_at(limit, attempt).await {
                    Ok(result) => result,
                    Err(_) => Err(Error::Timeout {
                        op: if by_deadline {
                            format!("connecting to bootstrap broker {addr} (overall deadline)")
                        } else {
                            format!("connecting to bootstrap broker {addr}")
                        },
                        after: limit - now,
                    }),
                },
            };
            match result {
                Ok(conn) => {
                    debug!(addr = %addr, rounds, "bootstrap connected");
                    backoff.reset();
                    return Ok(conn);
                }
                // Wrong credentials, an untrusted certificate or the wrong listener fail the
                // same way on every broker and in every round: said at once, not after the
                // bootstrap deadline.
                Err(e @ Error::Security(_)) => return Err(e),
                Err(e) => {
                    debug!(addr = %addr, error = %e, "bootstrap address failed");
                    last[idx] = Some(e);
                }
            }
        }
        if rounds >= limits.max_rounds.max(1) {
            break;
        }
        let pause = backoff.next_delay();
        if let Some(deadline) = deadline {
            if Instant::now()
                .checked_add(pause)
                .is_none_or(|t| t >= deadline)
            {
                break;
            }
        }
        tokio::time::sleep(pause).await;
    }
    let attempts = bootstrap
        .iter()
        .zip(last)
        .filter_map(|(addr, error)| {
            error.map(|error| BootstrapAttempt {
                addr: addr.clone(),
                error,
            })
        })
        .collect();
    Err(Error::Bootstrap(BootstrapError {
        attempts,
        rounds,
        elapsed: started.elapsed(),
    }))
}

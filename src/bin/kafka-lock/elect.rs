//! `kafka-lock elect`: leader election with a command. Each term is a `run` (the same waiting,
//! supervisor, lease and release, `run.rs`); when the command ends, is stopped, or leadership is
//! lost, kafka-lock campaigns again, until SIGINT or SIGTERM.
//!
//! A command that ends at once would otherwise make the lock change hands as fast as the group
//! can rebalance: a term shorter than `--min-term` delays the next campaign by `--min-term`,
//! doubling with each further short term up to 60 s (or `--min-term` if longer), and
//! `--max-terms` bounds the number of terms.

use std::time::{Duration, Instant};

use kafka_lock::internals::backoff::Backoff;
use rustix::process::Signal;

use crate::exit::{self, Failure};
use crate::report::{Reporter, Source};
use crate::run::{self, RunConfig, Signals, Timing};
use crate::{environ, serve, sys};

/// The default `--min-term`.
pub const DEFAULT_MIN_TERM: Duration = Duration::from_secs(1);
/// The longest delay between campaigns after short terms.
const MAX_DELAY: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct ElectConfig {
    pub run: RunConfig,
    pub max_terms: Option<u64>,
    pub min_term: Duration,
}

/// How the election ended, for the exit status.
enum Ended {
    /// SIGINT or SIGTERM: stopped as asked.
    Stopped,
    /// `--max-terms` reached: the last command's status.
    Terms(u8),
}

pub async fn elect(e: ElectConfig) -> Result<u8, Failure> {
    let mut rep = Reporter::new(&e.run.lock, e.run.events_json);
    match campaign(&e, &mut rep).await {
        Ok(Ended::Stopped) => {
            rep.exit(0, Source::KafkaLock);
            Ok(0)
        }
        Ok(Ended::Terms(status)) => run::conclude(&e.run, &mut rep, Ok(status)),
        Err(f) => run::conclude(&e.run, &mut rep, Err(f)),
    }
}

fn stops(sig: i32) -> bool {
    sig == Signal::INT.as_raw() || sig == Signal::TERM.as_raw()
}

async fn campaign(e: &ElectConfig, rep: &mut Reporter) -> Result<Ended, Failure> {
    let c = &e.run;
    environ::refuse_nested(&c.lock)?;
    let t = Timing::resolve(c)?;
    // Settings the lock refuses are reported before anything starts.
    run::options(c, &t)?;
    if let Some(addr) = c.metrics_listen {
        let bound = serve::start(addr).await?;
        rep.metrics_listening(&bound.to_string());
    }
    let mut signals = Signals::new()?;
    let mut delays = Backoff::new(e.min_term, MAX_DELAY.max(e.min_term), 2.0, 0.0);
    let mut terms: u64 = 0;
    loop {
        let (opts, rx) = run::options(c, &t)?;
        signals.last = None;
        let mut acquired_at = None;
        let result = run::term(c, t, opts, rx, &mut signals, rep, &mut acquired_at).await;
        let stopped = signals.last.is_some_and(stops);
        let status = match result {
            Ok(status) => status,
            // Interrupted while campaigning: the candidate has left the group.
            Err(_) if stopped && acquired_at.is_none() => return Ok(Ended::Stopped),
            // A term that ended badly is still a term: campaign again.
            Err(f) if matches!(f.status, exit::LOST | exit::NOT_ACQUIRED) => {
                exit::print_line(&f.line);
                f.status
            }
            // The cluster went away after a first term: keep campaigning, it may come back.
            Err(f) if f.status == exit::UNAVAILABLE && terms > 0 => {
                exit::print_line(&f.line);
                f.status
            }
            Err(f) => return Err(f),
        };
        if acquired_at.is_some() {
            terms += 1;
        }
        if stopped {
            return Ok(Ended::Stopped);
        }
        if e.max_terms.is_some_and(|max| terms >= max) {
            return Ok(Ended::Terms(status));
        }
        let short = acquired_at.is_none_or(|at| at.elapsed() < e.min_term);
        let delay = if short && !e.min_term.is_zero() {
            delays.next_delay()
        } else {
            delays.reset();
            Duration::ZERO
        };
        rep.term_ended(terms, status, delay);
        let until = Instant::now() + delay;
        while Instant::now() < until {
            tokio::select! {
                _ = tokio::time::sleep_until(until.into()) => {}
                sig = signals.recv() => if stops(sig) {
                    return Ok(Ended::Stopped);
                },
            }
        }
        if delay > Duration::ZERO {
            tracing::debug!(lock = %c.lock, delay = %sys::human(delay), "campaigning again after a short term");
        }
    }
}

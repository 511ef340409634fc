//! `kafka-lock observe`: one line per leadership change of a lock, and one for the leadership
//! as it is at the start, from [`kafka_lock::Observer`], which never joins the group. Runs until
//! a signal, then exits 0.

use std::io::Write;
use std::time::{Duration, UNIX_EPOCH};

use kafka_lock::{Leadership, LockOptions, LockState};

use crate::exit::{self, Failure};
use crate::history;
use crate::json::Obj;
use crate::output::shown;
use crate::run::Signals;
use crate::sys;

/// The version of `observe --json`'s schema (docs/events.md), kept apart from the `run`
/// events' own: its fields have kept their meaning.
const SCHEMA_VERSION: i32 = 1;

#[derive(Debug, Clone)]
pub struct ObserveConfig {
    pub bootstrap: String,
    pub lock: String,
    pub json: bool,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub client_id: String,
    pub ledger_topic: Option<String>,
    pub security: kafka_lock::Security,
    pub interval: Duration,
    pub via_describe: bool,
}

pub async fn observe(c: ObserveConfig) -> Result<u8, Failure> {
    let mut opts = LockOptions::new(&c.bootstrap, c.lock.clone())
        .security(c.security.clone())
        .client_id(c.client_id.clone())
        .request_timeout(c.request_timeout)
        .connect_timeout(c.connect_timeout);
    if let Some(t) = &c.ledger_topic {
        opts = opts.ledger_topic(t.clone());
    }
    let mut observer = opts.observer().interval(c.interval);
    if c.via_describe {
        observer = observer.via_describe();
    }
    let mut signals = Signals::new()?;
    loop {
        tokio::select! {
            l = observer.next() => {
                let l = l.map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
                let line = if c.json { to_json(&c.lock, &l) } else { to_text(&l) };
                let mut out = std::io::stdout().lock();
                // A reader that went away ends the observation; nothing else can be done.
                if writeln!(out, "{line}").and_then(|()| out.flush()).is_err() {
                    return Ok(0);
                }
            }
            sig = signals.recv() => {
                tracing::debug!(signal = %sys::signal_name(sig), "observation stopped");
                return Ok(0);
            }
        }
    }
}

fn unix_ms(l: &Leadership) -> i64 {
    l.observed_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub fn to_text(l: &Leadership) -> String {
    let when = history::time(unix_ms(l));
    let what = match (&l.leader, &l.state) {
        (Some(x), _) => {
            let mut details = vec![format!("member {}", shown(&x.member_id))];
            if let Some(g) = x.generation {
                details.push(format!("generation {g}"));
            }
            // Only the ledger knows the fencing token: without it, say so rather than give
            // the generation under the token's name.
            match x.ledger_token {
                Some(t) => details.push(format!("token {t}")),
                None => details.push(
                    "token unknown (only its ledger hold tells it: --ledger-topic)".to_owned(),
                ),
            }
            if let Some(h) = &x.host {
                details.push(format!("from {}", shown(h)));
            }
            match &x.label {
                Some(label) => format!("leader: {} ({})", shown(label), details.join(", ")),
                None => format!("leader: {}", details.join(", ")),
            }
        }
        (None, LockState::Free) => "leader: none".to_owned(),
        (None, _) => format!(
            "leader: unknown ({})",
            l.reason
                .as_deref()
                .unwrap_or("the group is between generations")
        ),
    };
    format!("{when} {what}")
}

pub fn to_json(lock: &str, l: &Leadership) -> String {
    let leader = l.leader.as_ref().map(|x| {
        Obj::new()
            .str("member_id", &x.member_id)
            .opt_str("label", x.label.as_deref())
            .opt_str("host", x.host.as_deref())
            .opt_int("generation", x.generation)
            .opt_int("ledger_token", x.ledger_token)
            .opt_int("token", x.ledger_token)
            .opt_int("since_unix_ms", x.since_unix_ms)
            .finish()
    });
    let obj = Obj::new()
        .int("v", SCHEMA_VERSION)
        .str("event", "leader")
        .str("lock", lock)
        .str("state", l.state.as_str());
    let obj = match leader {
        Some(x) => obj.raw("leader", &x),
        None => obj.null("leader"),
    };
    obj.opt_str("reason", l.reason.as_deref())
        .str("via", l.via.as_str())
        .int("unix_ms", unix_ms(l))
        .int("mono_ns", sys::mono_ns())
        .finish()
}

//! What `run` tells the person or program watching: `--events json` lines (on stderr, or on
//! the target of `--events-file` / `--events-fd`), or on a terminal a status line saying what
//! the lock is waiting for. Everything goes through the non-blocking output queues (`output`):
//! reporting never makes the lock session wait. The events and their fields are documented in
//! docs/events.md, which tests/it/cli.rs checks every event against.

use std::io::IsTerminal;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kafka_lock::{FencingToken, HolderInfo, LossReason};

use crate::json::Obj;
use crate::{output, sys};

/// The version of the events' schema (docs/events.md), the `v` of every event. Adding events or
/// fields keeps it; removing or renaming one, or changing what one means, raises it. Version 2:
/// `waiting`'s holders carry their `generation`, and their `token` is null, where version 1
/// called the generation `token` (not the fencing token when the holder uses a ledger).
pub const SCHEMA_VERSION: i32 = 2;

/// Whose exit status kafka-lock exits with, for the final `exit` event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The command's own (128+N if signal N ended it).
    Command,
    /// kafka-lock's: it failed, was interrupted, or the command never ran.
    KafkaLock,
}

/// How the child ended, for `child_exited`.
#[derive(Debug, Clone, Copy)]
pub struct ChildEnd {
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// The status kafka-lock passes on: the code, or 128 + the signal.
    pub status: u8,
}

pub struct Reporter {
    lock: String,
    json: bool,
    /// A person is watching stderr (and did not ask for JSON).
    tty: bool,
    member_id: Option<String>,
    /// The token's value (the ledger offset with a ledger, else the generation).
    token: Option<i64>,
    generation: Option<i32>,
    /// A status line without a newline is on screen.
    line_open: bool,
    started: Instant,
    /// The holder we are waiting for and since when we have seen it hold.
    holder: Option<(HolderInfo, Instant)>,
    position: i32,
    seen_waiting: bool,
}

impl Reporter {
    pub fn new(lock: &str, json: bool) -> Self {
        Reporter {
            lock: lock.to_owned(),
            json,
            // Events elsewhere leave stderr to people.
            tty: (!json || output::events_apart()) && std::io::stderr().is_terminal(),
            member_id: None,
            token: None,
            generation: None,
            line_open: false,
            started: Instant::now(),
            holder: None,
            position: -1,
            seen_waiting: false,
        }
    }

    /// Whether a terminal status line is being kept up to date.
    pub fn wants_ticks(&self) -> bool {
        self.tty
    }

    /// The holder named by the last assignment, as "label (member m, generation g)".
    pub fn holder_text(&self) -> Option<String> {
        self.holder.as_ref().map(|(h, _)| describe(h))
    }

    fn event(&self, name: &str) -> Obj {
        let unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i128)
            .unwrap_or(0);
        let obj = Obj::new()
            .int("v", SCHEMA_VERSION)
            .str("event", name)
            .str("lock", &self.lock)
            .opt_str("member_id", self.member_id.as_deref())
            .opt_int("token", self.token)
            .opt_int("generation", self.generation)
            .int("unix_ms", unix_ms)
            .int("mono_ns", sys::mono_ns());
        // Lines lost to a full queue so far (events or stderr read too slowly), on every event
        // that gets through once there are any.
        match output::events_dropped() {
            0 => obj,
            n => obj.int("dropped", n),
        }
    }

    fn emit(&mut self, obj: Obj) {
        if self.json {
            let mut line = obj.finish();
            line.push('\n');
            // One write per line: the child shares stderr, and a single write of a short line
            // is not interleaved with its output.
            output::event(line.as_bytes());
        }
    }

    /// Ends the terminal status line so the next line starts on its own.
    pub fn close_line(&mut self) {
        if self.line_open {
            output::write(b"\n");
            self.line_open = false;
        }
    }

    fn status_line(&mut self, text: &str) {
        // A line that wraps cannot be rewritten in place, so it is cut to the terminal's width.
        let width = sys::terminal_width()
            .unwrap_or(80)
            .saturating_sub(1)
            .max(20);
        let text: String = if text.chars().count() > width {
            text.chars()
                .take(width - 1)
                .chain(std::iter::once('…'))
                .collect()
        } else {
            text.to_owned()
        };
        // Carriage return and "erase line": the line is rewritten in place while waiting.
        output::write(format!("\r\x1b[2K{text}").as_bytes());
        self.line_open = true;
    }

    pub fn waiting(
        &mut self,
        member_id: String,
        holder: Option<HolderInfo>,
        holders: Vec<HolderInfo>,
        position: i32,
    ) {
        self.seen_waiting = true;
        if !member_id.is_empty() {
            self.member_id = Some(member_id);
        }
        self.position = position;
        self.holder = match (holder, self.holder.take()) {
            (Some(h), Some((old, since))) if old.member_id == h.member_id => Some((h, since)),
            (Some(h), _) => Some((h, Instant::now())),
            (None, _) => None,
        };
        let mut obj = self.event("waiting").int("position", position);
        obj = match &self.holder {
            Some((h, _)) => obj.raw(
                "holder",
                &Obj::new()
                    .str("member_id", &h.member_id)
                    .opt_str("label", h.label.as_deref())
                    .int("generation", h.generation)
                    // A waiter reads no ledger, so it cannot know the holder's fencing token.
                    .null("token")
                    .finish(),
            ),
            None => obj.null("holder"),
        };
        // Every holder with its permit slot; additive to `holder`, which is the first.
        let holders: Vec<String> = holders
            .iter()
            .map(|h| {
                Obj::new()
                    .str("member_id", &h.member_id)
                    .opt_str("label", h.label.as_deref())
                    .int("generation", h.generation)
                    .null("token")
                    .int("permit", h.slot)
                    .finish()
            })
            .collect();
        obj = obj.raw("holders", &crate::json::array(&holders));
        self.emit(obj);
        self.tick();
    }

    /// Rewrites the terminal status line (called on every waiting event and every second).
    pub fn tick(&mut self) {
        if !self.tty || !self.seen_waiting {
            return;
        }
        let waited = sys::human(Duration::from_secs(self.started.elapsed().as_secs()));
        let who = match &self.holder {
            Some((h, since)) => format!(
                "held by {} for at least {}",
                describe(h),
                sys::human(Duration::from_secs(since.elapsed().as_secs()))
            ),
            None => "no holder yet (the group is forming)".to_owned(),
        };
        let queue = match self.position {
            p if p <= 0 => String::new(),
            1 => ", we are next".to_owned(),
            p => format!(", {p} ahead of us"),
        };
        let text = format!(
            "kafka-lock: waiting {waited} for lock {:?}: {who}{queue}",
            self.lock
        );
        self.status_line(&text);
    }

    pub fn acquired(&mut self, token: &FencingToken, permit: u16) {
        self.member_id = Some(token.member_id.clone());
        self.token = Some(token.value());
        self.generation = Some(token.generation);
        self.emit(self.event("acquired").int("permit", permit));
        if self.tty && self.seen_waiting {
            let text = format!(
                "kafka-lock: acquired lock {:?} after {} (token {})",
                self.lock,
                sys::human(self.started.elapsed()),
                token
            );
            self.status_line(&text);
            self.close_line();
        }
    }

    pub fn token_changed(&mut self, token: &FencingToken) {
        self.token = Some(token.value());
        self.generation = Some(token.generation);
        self.emit(self.event("token_changed"));
    }

    pub fn child_started(&mut self, pid: u32, supervisor_pid: u32) {
        let obj = self
            .event("child_started")
            .int("child_pid", pid)
            .int("supervisor_pid", supervisor_pid);
        self.emit(obj);
    }

    /// `lease_end_ns`: when the lease ran out, on CLOCK_MONOTONIC.
    pub fn lost(&mut self, reason: &LossReason, lease_end_ns: Option<u64>) {
        let obj = self
            .event("lost")
            .str("reason", reason.as_str())
            .str("detail", &reason.to_string())
            .opt_int("lease_end_mono_ns", lease_end_ns);
        self.emit(obj);
    }

    pub fn child_exited(&mut self, end: ChildEnd) {
        let obj = self
            .event("child_exited")
            .opt_int("exit_code", end.code)
            .opt_int("signal", end.signal)
            .int("status", end.status);
        self.emit(obj);
    }

    /// The command's checkpoint was stored.
    pub fn checkpoint(&mut self, value: &str) {
        let obj = self.event("checkpoint").int("bytes", value.len() as u64);
        self.emit(obj);
    }

    /// The hold ended at `held_until_ns` (on the `mono_ns` clock, inside the lease), with the
    /// command and everything it started gone; the LeaveGroup goes out next.
    pub fn released(&mut self, held_until_ns: u64) {
        let obj = self
            .event("released")
            .int("held_until_mono_ns", held_until_ns);
        self.emit(obj);
    }

    /// `elect`: a term (or a campaign that ended without one) is over; the next campaign
    /// starts after `delay`.
    pub fn term_ended(&mut self, terms: u64, status: u8, delay: Duration) {
        self.close_line();
        let obj = self
            .event("term_ended")
            .int("terms", terms)
            .int("status", status)
            .int("next_campaign_ms", delay.as_millis() as u64);
        self.emit(obj);
    }

    /// The metrics endpoint is up at `address`.
    pub fn metrics_listening(&mut self, address: &str) {
        let obj = self.event("metrics_listening").str("address", address);
        self.emit(obj);
    }

    /// Something about the settings the person should know (a key ignored, host name checks
    /// off): a line on stderr, and a `warning` event.
    pub fn warning(&mut self, message: &str) {
        self.close_line();
        crate::exit::print_line(&format!("warning: {message}"));
        let obj = self.event("warning").str("message", message);
        self.emit(obj);
    }

    /// kafka-lock's own failure: the status it exits with, what it means (`kind`, which a
    /// replaced status keeps) and the line it also prints on stderr.
    pub fn failed(&mut self, status: u8, kind: &str, message: &str) {
        self.close_line();
        let obj = self
            .event("failed")
            .int("status", status)
            .str("kind", kind)
            .str("message", message);
        self.emit(obj);
    }

    /// The last event: the status kafka-lock exits with, and whose it is.
    pub fn exit(&mut self, status: u8, source: Source) {
        let source = match source {
            Source::Command => "command",
            Source::KafkaLock => "kafka-lock",
        };
        let obj = self
            .event("exit")
            .int("status", status)
            .str("source", source);
        self.emit(obj);
    }
}

fn describe(h: &HolderInfo) -> String {
    match &h.label {
        // The generation, never called the token: with a ledger the holder's fencing token is
        // another number, which a waiter does not know.
        Some(l) => format!(
            "{} (member {}, generation {})",
            output::shown(l),
            output::shown(&h.member_id),
            h.generation
        ),
        None => format!(
            "member {} (generation {})",
            output::shown(&h.member_id),
            h.generation
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_carry_the_count_of_dropped_lines_once_there_are_any() {
        let rep = Reporter::new("l", true);
        // A line larger than the whole queue is always dropped, whatever else runs.
        assert!(!output::write(&vec![b'x'; 4 << 20]));
        let line = rep.event("acquired").finish();
        let n: u64 = line
            .split("\"dropped\":")
            .nth(1)
            .and_then(|rest| rest.trim_end_matches('}').split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no dropped count in {line}"));
        assert!(n >= 1, "{line}");
    }
}

//! `kafka-lock history`: who held a lock, when, for how long and how each hold ended, read from
//! the lock's ledger. It never joins the group.

use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use kafka_lock::{History, Hold, HoldEnd, LockOptions};

use crate::exit::{self, Failure};
use crate::json::{self, Obj};
use crate::output::shown;
use crate::sys;

/// `history --help`'s text after the options; the creation command is the library's.
pub fn after_help() -> String {
    format!(
        "\
The ledger is a topic with exactly one partition, shared by any number of locks, which kafka-lock
reads and writes but never creates. Create it once, for example:

  {create}

On a single broker, use {single} instead (with
min.insync.replicas=2 and one replica every append fails). A ledger topic that does not exist or
has another partition count is a setting error: status 78.

Its record offsets are the locks' fencing tokens, so they must never go backwards: never delete
and recreate it, and keep unclean leader election off (an unclean election can lose records a
holder was told are durable). It is a log, not a compacted topic: retention (time or size) is how
far back the history reaches. kafka-lock reads only uncompressed batches, so compression.type must
stay producer (or uncompressed); a ledger topic with another is refused at start (status 78).

How each hold ended: released; lost (the reason, as the holder recorded it); silent (no end
record, and a later hold began: the holder was killed, or cut off for good, and the lock moved on
after its session timeout); retried (an ACQUIRED record whose append was retried; the retry is the
hold); open (no end record and no later hold: still holding, or its holder died and nobody has
taken the lock since). Times are the writers' wall clocks, in UTC; how long a hold lasted is the
holder's own monotonic measure.",
        create = kafka_lock::internals::ledger::create_topic_command("kafka-lock-ledger"),
        single = kafka_lock::internals::ledger::SINGLE_BROKER_SETTINGS,
    )
}

#[derive(Debug, Clone)]
pub struct HistoryConfig {
    pub bootstrap: String,
    pub lock: String,
    pub ledger_topic: String,
    /// Unix milliseconds.
    pub since: Option<i64>,
    pub json: bool,
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub client_id: String,
    pub security: kafka_lock::Security,
    pub retry_backoff: Option<(Duration, Duration)>,
}

/// `--since`: a duration before `now` (`24h`, `7d`) or a time (RFC 3339; without a zone, UTC).
pub fn parse_since(s: &str, now: SystemTime) -> Result<i64, Failure> {
    let s = s.trim();
    let at = match humantime::parse_duration(s) {
        Ok(d) => now.checked_sub(d).unwrap_or(UNIX_EPOCH),
        Err(_) => humantime::parse_rfc3339_weak(s).map_err(|e| {
            Failure::new(
                exit::USAGE,
                format!(
                    "--since {s:?} is neither a duration (24h, 7d) nor a time \
                     (2026-11-30T02:00:00Z): {e}; see `kafka-lock history --help`"
                ),
            )
        })?,
    };
    Ok(unix_ms(at))
}

fn unix_ms(t: SystemTime) -> i64 {
    match t.duration_since(UNIX_EPOCH) {
        Ok(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX),
        Err(e) => -i64::try_from(e.duration().as_millis()).unwrap_or(i64::MAX),
    }
}

pub async fn history(c: HistoryConfig) -> Result<u8, Failure> {
    let mut opts = LockOptions::new(&c.bootstrap, c.lock.clone())
        .client_id(c.client_id.clone())
        .request_timeout(c.request_timeout)
        .connect_timeout(c.connect_timeout)
        .security(c.security.clone())
        .ledger_topic(c.ledger_topic.clone());
    if let Some((initial, max)) = c.retry_backoff {
        opts = opts.retry_backoff(initial, max);
    }
    opts.validate()
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    let h = opts
        .history()
        .await
        .map_err(|e| exit::failure(&e, &c.lock, &c.bootstrap))?;
    let holds = match c.since {
        Some(t) => h.since(t),
        None => h.holds.iter().collect(),
    };
    let out = if c.json {
        to_json(&c.lock, &c.ledger_topic, &h, &holds)
    } else {
        to_text(&c.lock, &c.ledger_topic, &h, &holds)
    };
    let _ = writeln!(std::io::stdout(), "{out}");
    Ok(0)
}

/// The first millisecond of the year 10000, which RFC 3339 cannot write (humantime's formatter
/// fails there, and `to_string` would panic): a record's time comes from another process.
const YEAR_10000_MS: u64 = 253_402_300_800_000;

/// A wall-clock time as RFC 3339 UTC with milliseconds, or the raw number when it has none.
pub fn time(unix_ms: i64) -> String {
    match u64::try_from(unix_ms) {
        Ok(ms) if ms < YEAR_10000_MS => {
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms)).to_string()
        }
        _ => format!("{unix_ms} ms since 1970"),
    }
}

fn holder(h: &Hold) -> String {
    let mut details = vec![
        format!("member {}", shown(&h.member_id)),
        format!("generation {}", h.generation),
    ];
    let place = match (&h.host, h.pid) {
        (Some(host), Some(pid)) => Some(format!("{} pid {pid}", shown(host))),
        (Some(host), None) => Some(shown(host).into_owned()),
        (None, Some(pid)) => Some(format!("pid {pid}")),
        (None, None) => None,
    };
    // The default label is "<hostname> pid <pid>" itself: said once.
    if let Some(place) =
        place.filter(|p| h.label.as_deref().map(shown).as_deref() != Some(p.as_str()))
    {
        details.push(place);
    }
    match &h.label {
        Some(l) => format!("{} ({})", shown(l), details.join(", ")),
        None => details.join(", "),
    }
}

fn end_text(h: &Hold) -> String {
    match &h.end {
        HoldEnd::Released { unix_ms, held_ms } => format!(
            "held {}, released at {}",
            sys::human(Duration::from_millis(*held_ms)),
            time(*unix_ms)
        ),
        HoldEnd::Lost {
            unix_ms,
            held_ms,
            reason,
            detail,
        } => format!(
            "held {}, LOST ({}: {}), recorded at {}",
            sys::human(Duration::from_millis(*held_ms)),
            shown(reason),
            shown(detail),
            time(*unix_ms)
        ),
        HoldEnd::Silent {
            next_token,
            before_unix_ms,
        } => format!(
            "no end record: ended without a word before token {next_token}{} (killed, or cut off \
             for good)",
            before_unix_ms
                .map(|t| format!(" began at {}", time(t)))
                .unwrap_or_default()
        ),
        HoldEnd::Retried { by } => {
            format!("not a hold: its append was retried, and token {by} is the hold")
        }
        HoldEnd::Open => "no end record yet: still holding, or its holder died and nobody has \
                          taken the lock since"
            .to_owned(),
        // An end a newer library knows and this binary does not print yet.
        other => format!("ended: {}", other.name()),
    }
}

/// "1 hold", "2 holds", "0 holds".
fn count(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

pub fn to_text(lock: &str, topic: &str, h: &History, holds: &[&Hold]) -> String {
    let mut out = format!(
        "lock {lock:?}: {} in ledger topic {topic:?} (offsets {} to {})",
        count(holds.len(), "hold", "holds"),
        h.first_offset,
        h.end_offset
    );
    // A semaphore's holds overlap; each line then says which permit (tokens increase within it).
    let semaphore = h.holds.iter().any(|x| x.slot > 0);
    for hold in holds {
        let began = hold
            .acquired_unix_ms
            .map(time)
            .unwrap_or_else(|| "(ACQUIRED record no longer retained)".to_owned());
        let permit = if semaphore {
            format!("  permit {}", hold.slot)
        } else {
            String::new()
        };
        out.push_str(&format!(
            "\ntoken {}{permit}  {began}  {}  {}",
            hold.token,
            holder(hold),
            end_text(hold)
        ));
        if let Some((value, at)) = &hold.checkpoint {
            out.push_str(&format!("\n  checkpoint {value:?} stored at {}", time(*at)));
        }
    }
    if !h.unreadable.is_empty() {
        out.push_str(&format!(
            "\n{} could not be read:",
            count(h.unreadable.len(), "record or batch", "records or batches")
        ));
        for u in &h.unreadable {
            out.push_str(&format!("\n  offset {}: {}", u.offset, u.error));
        }
    }
    out
}

pub fn to_json(lock: &str, topic: &str, h: &History, holds: &[&Hold]) -> String {
    let items: Vec<String> = holds
        .iter()
        .map(|hold| {
            let mut o = Obj::new()
                .int("token", hold.token)
                .int("permit", hold.slot)
                .int("generation", hold.generation)
                .str("member_id", &hold.member_id)
                .opt_str("label", hold.label.as_deref())
                .opt_str("host", hold.host.as_deref())
                .opt_int("pid", hold.pid)
                .opt_int("acquired_unix_ms", hold.acquired_unix_ms)
                .opt_str("acquired", hold.acquired_unix_ms.map(time).as_deref())
                .opt_int("lease_ms", hold.lease_ms)
                .str("end", hold.end.name())
                .opt_int("ended_unix_ms", hold.end.unix_ms())
                .opt_int("held_ms", hold.end.held_ms());
            o = match &hold.end {
                HoldEnd::Lost { reason, detail, .. } => {
                    o.str("reason", reason).str("detail", detail)
                }
                HoldEnd::Silent { next_token, .. } => o.int("next_token", *next_token),
                HoldEnd::Retried { by } => o.int("retried_as", *by),
                _ => o,
            };
            o.opt_str(
                "checkpoint",
                hold.checkpoint.as_ref().map(|(v, _)| v.as_str()),
            )
            .finish()
        })
        .collect();
    let unreadable: Vec<String> = h
        .unreadable
        .iter()
        .map(|u| {
            Obj::new()
                .int("offset", u.offset)
                .str("error", &u.error)
                .finish()
        })
        .collect();
    Obj::new()
        .str("lock", lock)
        .str("ledger_topic", topic)
        .int("first_offset", h.first_offset)
        .int("end_offset", h.end_offset)
        .raw("holds", &json::array(&items))
        .raw("unreadable", &json::array(&unreadable))
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn since_takes_durations_and_times() {
        let now = UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        assert_eq!(
            parse_since("24h", now).unwrap(),
            (1_800_000_000 - 86_400) * 1000
        );
        assert_eq!(
            parse_since("2026-11-30T02:00:00Z", now).unwrap(),
            1_795_996_800_000 + 2 * 3_600_000
        );
        assert_eq!(
            parse_since("2026-11-30 02:00:00", now).unwrap(),
            1_795_996_800_000 + 2 * 3_600_000
        );
        let f = parse_since("yesterday", now).unwrap_err();
        assert_eq!(f.status, exit::USAGE);
    }

    #[test]
    fn any_time_a_record_carries_can_be_printed() {
        assert_eq!(time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(time(253_402_300_799_999), "9999-12-31T23:59:59.999Z");
        assert_eq!(time(253_402_300_800_000), "253402300800000 ms since 1970");
        assert_eq!(time(i64::MAX), format!("{} ms since 1970", i64::MAX));
        assert_eq!(time(-5), "-5 ms since 1970");
    }

    /// Every field a holder wrote into the ledger reaches the terminal escaped: no escape
    /// sequence runs, and no line of its own can be forged.
    #[test]
    fn ledger_fields_are_printed_escaped() {
        let evil = "x\u{1b}[2J\u{7}\r\nfake: \u{202e}";
        let mut h = Hold::default();
        h.member_id = evil.into();
        h.label = Some(evil.into());
        h.host = Some(evil.into());
        h.end = HoldEnd::Lost {
            unix_ms: 2_000,
            held_ms: 1_000,
            reason: evil.into(),
            detail: evil.into(),
        };
        h.checkpoint = Some((evil.into(), 1_500));
        let mut history = History::default();
        history.holds = vec![h.clone()];
        let text = to_text("l", "t", &history, &[&h]);
        assert!(
            !text.contains(|c: char| (c.is_control() && c != '\n') || c == '\u{202e}'),
            "{text:?}"
        );
        assert!(!text.lines().any(|l| l.starts_with("fake")), "{text}");
        assert!(text.contains("x\\u{1b}[2J"), "{text}");
    }

    #[test]
    fn every_end_reads_as_one_line() {
        let hold = |end| {
            let mut h = Hold::default();
            h.token = 7;
            h.generation = 2;
            h.member_id = "m".into();
            h.label = Some("job".into());
            h.host = Some("h".into());
            h.pid = Some(9);
            h.acquired_unix_ms = Some(1_000);
            h.lease_ms = Some(9000);
            h.end = end;
            h.checkpoint = Some(("c".into(), 1_500));
            h
        };
        let holds = [
            hold(HoldEnd::Released {
                unix_ms: 2_000,
                held_ms: 1_000,
            }),
            hold(HoldEnd::Silent {
                next_token: 9,
                before_unix_ms: None,
            }),
            hold(HoldEnd::Open),
        ];
        let mut h = History::default();
        h.holds = holds.to_vec();
        let refs: Vec<&Hold> = holds.iter().collect();
        let text = to_text("l", "t", &h, &refs);
        assert!(text.starts_with("lock \"l\": 3 holds in"), "{text}");
        let one = to_text("l", "t", &h, &refs[..1]);
        assert!(one.starts_with("lock \"l\": 1 hold in"), "{one}");
        // A default label is the host and pid already: not said twice.
        let mut default_label = holds[0].clone();
        default_label.label = Some("h pid 9".into());
        let line = to_text("l", "t", &h, &[&default_label]);
        assert_eq!(line.matches("h pid 9").count(), 1, "{line}");
        assert!(line.contains("h pid 9 (member m, generation 2)"), "{line}");
        assert!(text.contains("token 7  1970-01-01T00:00:01.000Z  job (member m, generation 2, h pid 9)  held 1s, released"), "{text}");
        assert!(!text.contains("permit"), "a mutex names no permit: {text}");
        assert!(
            text.contains("ended without a word before token 9"),
            "{text}"
        );
        let j = to_json("l", "t", &h, &refs);
        let v: Vec<&str> = j.matches("\"end\":").collect();
        assert_eq!(v.len(), 3, "{j}");
        assert!(
            j.contains(r#""end":"silent""#) && j.contains(r#""next_token":9"#),
            "{j}"
        );
        assert!(j.contains(r#""permit":0"#), "{j}");
    }

    #[test]
    fn a_semaphores_history_names_each_holds_permit() {
        let hold = |token, slot| {
            let mut h = Hold::default();
            h.token = token;
            h.slot = slot;
            h.member_id = "m".into();
            h
        };
        let mut h = History::default();
        h.holds = vec![hold(3, 0), hold(4, 1)];
        let refs: Vec<&Hold> = h.holds.iter().collect();
        let text = to_text("l", "t", &h, &refs);
        assert!(
            text.contains("token 3  permit 0 ") && text.contains("token 4  permit 1 "),
            "{text}"
        );
        assert!(to_json("l", "t", &h, &refs).contains(r#""permit":1"#));
    }
}

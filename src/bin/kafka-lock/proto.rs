//! The messages between `kafka-lock run` (K) and its supervisor process (P), one per datagram of
//! a SOCK_SEQPACKET socket pair, as one short ASCII line each.
//!
//! ```text
//! K → P   ENV <NAME>=<val>  one variable of the command's environment for this hold (raw
//!                           bytes, up to 65 KiB: the one message that is not a short line)
//!         LEASE <ns>        the lease now ends at this CLOCK_MONOTONIC reading; the first
//!                           one, after the ENVs, starts the command (once every
//!                           message queued behind it is read: a STOP there wins)
//!         STOP              the lock is lost: stop the command's tree now
//!         SIGNAL <n>        pass signal n on to the command's process group
//! P → K   PID <pid>         the command runs, in process group <pid>
//!         FAILED <errno>    the command could not be started
//!         EXPIRED <ns>      P reached the lease end <ns> itself and is stopping the tree
//!         EXIT CODE <n>     the command exited with n
//!         EXIT SIGNAL <n>   the command was ended by signal n
//!         GONE              every process P started, and all they started, is gone
//!         ERROR <text>      P cannot go on (it stops the tree, then says GONE if it can)
//! ```
//!
//! Datagrams keep messages whole: a sender never blocks on a half-written line, and a reader
//! never reassembles one. Each side parses what the other sends as untrusted input: anything
//! unexpected is a [`ProtoError`], never a panic.

use std::fmt;

/// Longer datagrams are refused: every valid message is far shorter.
pub const MAX_MESSAGE: usize = 256;

/// The longest ENV datagram: room for the largest checkpoint passed in the environment
/// (64 KiB, run.rs), its name and the verb.
pub const MAX_ENV_MESSAGE: usize = 65 * 1024;

/// Names K may pass with ENV: the hold's own variables, nothing that could change what the
/// command is or how it is found.
const ENV_PREFIX: &str = "KAFKA_LOCK_";

/// `ENV <NAME>=<value>`: one variable of the command's environment for this hold, sent by K
/// before the first LEASE. The value is raw bytes (a path, a checkpoint): anything but NUL,
/// which no environment can hold.
pub fn encode_env(name: &str, value: &std::ffi::OsStr) -> Result<Vec<u8>, ProtoError> {
    use std::os::unix::ffi::OsStrExt;
    let mut msg = Vec::with_capacity(4 + name.len() + 1 + value.len());
    msg.extend_from_slice(b"ENV ");
    msg.extend_from_slice(name.as_bytes());
    msg.push(b'=');
    msg.extend_from_slice(value.as_bytes());
    parse_env(&msg).unwrap_or(Err(ProtoError::Empty))?;
    Ok(msg)
}

/// The variable an ENV datagram carries; `None` if the datagram is not ENV.
#[allow(clippy::type_complexity)]
pub fn parse_env(
    bytes: &[u8],
) -> Option<Result<(std::ffi::OsString, std::ffi::OsString), ProtoError>> {
    use std::os::unix::ffi::OsStrExt;
    let rest = bytes.strip_prefix(b"ENV ")?;
    if bytes.len() > MAX_ENV_MESSAGE {
        return Some(Err(ProtoError::TooLong(bytes.len())));
    }
    let Some(eq) = rest.iter().position(|b| *b == b'=') else {
        return Some(Err(bad("ENV", String::from_utf8_lossy(rest))));
    };
    let (name, value) = (&rest[..eq], &rest[eq + 1..]);
    let name_ok = name.starts_with(ENV_PREFIX.as_bytes())
        && name
            .iter()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || *b == b'_');
    if !name_ok {
        return Some(Err(bad("ENV", String::from_utf8_lossy(name))));
    }
    if value.contains(&0) {
        return Some(Err(bad("ENV", "a value with a NUL byte")));
    }
    Some(Ok((
        std::ffi::OsStr::from_bytes(name).to_owned(),
        std::ffi::OsStr::from_bytes(value).to_owned(),
    )))
}

/// What K tells P.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToSupervisor {
    Lease { end_ns: u64 },
    Stop,
    Signal(i32),
}

/// How the command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChildExit {
    Code(i32),
    Signal(i32),
}

/// What P tells K.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FromSupervisor {
    Pid(u32),
    Failed { errno: i32 },
    Expired { lease_end_ns: u64 },
    Exit(ChildExit),
    Gone,
    Error(String),
}

/// A datagram that is not a valid message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProtoError {
    Empty,
    TooLong(usize),
    NotAscii,
    Unknown(String),
    BadField {
        verb: &'static str,
        field: String,
    },
    Fields {
        verb: &'static str,
        expected: usize,
        got: usize,
    },
}

impl fmt::Display for ProtoError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ProtoError::Empty => write!(f, "an empty message"),
            ProtoError::TooLong(n) => write!(f, "a message of {n} bytes (at most {MAX_MESSAGE})"),
            ProtoError::NotAscii => write!(f, "a message that is not printable ASCII"),
            ProtoError::Unknown(v) => write!(f, "an unknown message {v:?}"),
            ProtoError::BadField { verb, field } => write!(f, "{verb} with a bad field {field:?}"),
            ProtoError::Fields {
                verb,
                expected,
                got,
            } => write!(f, "{verb} with {got} fields instead of {expected}"),
        }
    }
}

impl std::error::Error for ProtoError {}

impl ToSupervisor {
    pub fn encode(&self) -> String {
        match self {
            ToSupervisor::Lease { end_ns } => format!("LEASE {end_ns}\n"),
            ToSupervisor::Stop => "STOP\n".to_owned(),
            ToSupervisor::Signal(n) => format!("SIGNAL {n}\n"),
        }
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, ProtoError> {
        let words = words(bytes)?;
        match words.as_slice() {
            ["LEASE", rest @ ..] => Ok(ToSupervisor::Lease {
                end_ns: number("LEASE", rest)?,
            }),
            ["STOP", rest @ ..] => {
                arity("STOP", rest, 0)?;
                Ok(ToSupervisor::Stop)
            }
            ["SIGNAL", rest @ ..] => Ok(ToSupervisor::Signal(signal("SIGNAL", rest)?)),
            [verb, ..] => Err(ProtoError::Unknown(verb.to_string())),
            [] => Err(ProtoError::Empty),
        }
    }
}

impl FromSupervisor {
    pub fn encode(&self) -> String {
        match self {
            FromSupervisor::Pid(pid) => format!("PID {pid}\n"),
            FromSupervisor::Failed { errno } => format!("FAILED {errno}\n"),
            FromSupervisor::Expired { lease_end_ns } => format!("EXPIRED {lease_end_ns}\n"),
            FromSupervisor::Exit(ChildExit::Code(c)) => format!("EXIT CODE {c}\n"),
            FromSupervisor::Exit(ChildExit::Signal(s)) => format!("EXIT SIGNAL {s}\n"),
            FromSupervisor::Gone => "GONE\n".to_owned(),
            FromSupervisor::Error(text) => {
                // Kept to one printable line that fits a datagram with room to spare.
                let clean: String = text
                    .chars()
                    .map(|c| if c.is_ascii_graphic() { c } else { ' ' })
                    .take(MAX_MESSAGE - 16)
                    .collect();
                format!("ERROR {}\n", clean.trim())
            }
        }
    }

    pub fn parse(bytes: &[u8]) -> Result<Self, ProtoError> {
        let words = words(bytes)?;
        match words.as_slice() {
            ["PID", rest @ ..] => {
                let pid: u32 = number("PID", rest)?;
                // 0 and 1 cannot be the command: signalling those groups means something else.
                if pid <= 1 || pid > i32::MAX as u32 {
                    return Err(bad("PID", pid));
                }
                Ok(FromSupervisor::Pid(pid))
            }
            ["FAILED", rest @ ..] => Ok(FromSupervisor::Failed {
                errno: number("FAILED", rest)?,
            }),
            ["EXPIRED", rest @ ..] => Ok(FromSupervisor::Expired {
                lease_end_ns: number("EXPIRED", rest)?,
            }),
            ["EXIT", "CODE", rest @ ..] => {
                let code: i32 = number("EXIT", rest)?;
                if !(0..=255).contains(&code) {
                    return Err(bad("EXIT", code));
                }
                Ok(FromSupervisor::Exit(ChildExit::Code(code)))
            }
            ["EXIT", "SIGNAL", rest @ ..] => Ok(FromSupervisor::Exit(ChildExit::Signal(signal(
                "EXIT", rest,
            )?))),
            ["EXIT", rest @ ..] => Err(ProtoError::BadField {
                verb: "EXIT",
                field: rest.first().unwrap_or(&"").to_string(),
            }),
            ["GONE", rest @ ..] => {
                arity("GONE", rest, 0)?;
                Ok(FromSupervisor::Gone)
            }
            ["ERROR", rest @ ..] => Ok(FromSupervisor::Error(rest.join(" "))),
            [verb, ..] => Err(ProtoError::Unknown(verb.to_string())),
            [] => Err(ProtoError::Empty),
        }
    }
}

/// Splits a datagram into words; one trailing newline is allowed.
fn words(bytes: &[u8]) -> Result<Vec<&str>, ProtoError> {
    if bytes.len() > MAX_MESSAGE {
        return Err(ProtoError::TooLong(bytes.len()));
    }
    let line = bytes.strip_suffix(b"\n").unwrap_or(bytes);
    if line.is_empty() {
        return Err(ProtoError::Empty);
    }
    if !line.iter().all(|b| b.is_ascii_graphic() || *b == b' ') {
        return Err(ProtoError::NotAscii);
    }
    // Checked above: printable ASCII is UTF-8.
    let text = std::str::from_utf8(line).map_err(|_| ProtoError::NotAscii)?;
    Ok(text.split(' ').filter(|w| !w.is_empty()).collect())
}

fn arity(verb: &'static str, rest: &[&str], expected: usize) -> Result<(), ProtoError> {
    if rest.len() == expected {
        Ok(())
    } else {
        Err(ProtoError::Fields {
            verb,
            expected,
            got: rest.len(),
        })
    }
}

fn number<T: std::str::FromStr>(verb: &'static str, rest: &[&str]) -> Result<T, ProtoError> {
    arity(verb, rest, 1)?;
    // Digits only (an optional minus for errno-like values): no "+1", no "0x1", no spaces.
    let field = rest[0];
    let digits = field.strip_prefix('-').unwrap_or(field);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad(verb, field));
    }
    field.parse().map_err(|_| bad(verb, field))
}

/// A signal number Linux has (1 to 64).
fn signal(verb: &'static str, rest: &[&str]) -> Result<i32, ProtoError> {
    let n: i32 = number(verb, rest)?;
    if (1..=64).contains(&n) {
        Ok(n)
    } else {
        Err(bad(verb, n))
    }
}

fn bad(verb: &'static str, field: impl fmt::Display) -> ProtoError {
    ProtoError::BadField {
        verb,
        field: field.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn every_message_survives_a_round_trip() {
        for m in [
            ToSupervisor::Lease { end_ns: 0 },
            ToSupervisor::Lease { end_ns: u64::MAX },
            ToSupervisor::Stop,
            ToSupervisor::Signal(1),
            ToSupervisor::Signal(64),
        ] {
            assert_eq!(ToSupervisor::parse(m.encode().as_bytes()), Ok(m));
        }
        for m in [
            FromSupervisor::Pid(2),
            FromSupervisor::Pid(i32::MAX as u32),
            FromSupervisor::Failed { errno: 2 },
            FromSupervisor::Expired {
                lease_end_ns: 123_456_789,
            },
            FromSupervisor::Exit(ChildExit::Code(0)),
            FromSupervisor::Exit(ChildExit::Code(255)),
            FromSupervisor::Exit(ChildExit::Signal(9)),
            FromSupervisor::Gone,
            FromSupervisor::Error("cannot poll: Bad file descriptor".into()),
        ] {
            assert_eq!(FromSupervisor::parse(m.encode().as_bytes()), Ok(m));
        }
    }

    #[test]
    fn malformed_messages_are_typed_errors() {
        let bad_to: &[&[u8]] = &[
            b"",
            b"\n",
            b"LEASE",
            b"LEASE \n",
            b"LEASE -1",
            b"LEASE +5",
            b"LEASE 0x10",
            b"LEASE 18446744073709551616",
            b"LEASE 1 2",
            b"STOP now",
            b"SIGNAL 0",
            b"SIGNAL 65",
            b"SIGNAL -9",
            b"SIGNAL TERM",
            b"lease 5",
            b"LEASE\t5",
            b"LEASE 5\n\n",
            b"LEASE \xff",
            b"PID 5",
        ];
        for m in bad_to {
            assert!(
                ToSupervisor::parse(m).is_err(),
                "{:?} parsed",
                String::from_utf8_lossy(m)
            );
        }
        let bad_from: &[&[u8]] = &[
            b"PID 0",
            b"PID 1",
            b"PID 2147483648",
            b"PID",
            b"EXIT",
            b"EXIT 3",
            b"EXIT CODE 256",
            b"EXIT CODE -1",
            b"EXIT SIGNAL 0",
            b"EXIT SIGNAL 99",
            b"GONE GONE",
            b"FAILED x",
            b"EXPIRED",
            b"STOP",
        ];
        for m in bad_from {
            assert!(
                FromSupervisor::parse(m).is_err(),
                "{:?} parsed",
                String::from_utf8_lossy(m)
            );
        }
        assert_eq!(
            ToSupervisor::parse(&[b'A'; MAX_MESSAGE + 1]),
            Err(ProtoError::TooLong(MAX_MESSAGE + 1))
        );
    }

    #[test]
    fn env_messages_carry_raw_values_and_only_the_holds_names() {
        use std::ffi::OsStr;
        use std::os::unix::ffi::OsStrExt;
        let value = OsStr::from_bytes(b"caf\xc3\xa9 \xff\n=x");
        let msg = encode_env("KAFKA_LOCK_CHECKPOINT", value).unwrap();
        assert_eq!(
            parse_env(&msg),
            Some(Ok(("KAFKA_LOCK_CHECKPOINT".into(), value.to_owned())))
        );
        let big = vec![b'x'; 64 * 1024];
        assert!(encode_env("KAFKA_LOCK_CHECKPOINT", OsStr::from_bytes(&big)).is_ok());
        for bad in [
            &b"ENV PATH=/tmp"[..],
            b"ENV LD_PRELOAD=/x.so",
            b"ENV KAFKA_LOCK_TOKEN",
            b"ENV kafka_lock_token=1",
            b"ENV KAFKA_LOCK_TOKEN=1\x002",
            b"ENV KAFKA_LOCK_X Y=1",
        ] {
            assert!(
                matches!(parse_env(bad), Some(Err(_))),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }
        let mut long = b"ENV KAFKA_LOCK_CHECKPOINT=".to_vec();
        long.resize(MAX_ENV_MESSAGE + 1, b'x');
        assert!(matches!(
            parse_env(&long),
            Some(Err(ProtoError::TooLong(_)))
        ));
        assert_eq!(parse_env(b"LEASE 5"), None);
        assert!(ToSupervisor::parse(&msg).is_err());
    }

    #[test]
    fn an_error_text_is_kept_to_one_short_line() {
        let long = format!("line one\nline two {}", "x".repeat(1000));
        let encoded = FromSupervisor::Error(long).encode();
        assert!(encoded.len() <= MAX_MESSAGE, "{}", encoded.len());
        assert_eq!(encoded.matches('\n').count(), 1);
        assert!(FromSupervisor::parse(encoded.as_bytes()).is_ok());
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = ToSupervisor::parse(&bytes);
            let _ = FromSupervisor::parse(&bytes);
        }

        #[test]
        fn arbitrary_words_never_panic(words in proptest::collection::vec("[A-Z0-9-]{0,22}", 0..5)) {
            let line = words.join(" ");
            let _ = ToSupervisor::parse(line.as_bytes());
            let _ = FromSupervisor::parse(line.as_bytes());
        }
    }
}

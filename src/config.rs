//! Client settings in Kafka's own vocabulary: the `client.properties` file people already give
//! Kafka's tools, and librdkafka's names for the same things.
//!
//! [`ClientConfig`] collects `key=value` settings from properties text (in the
//! `java.util.Properties` format), from single settings ([`ClientConfig::set`], as
//! `kcat -X` takes them), or both, a later setting of a key replacing an earlier one. Each value is
//! checked as it arrives, so an error names where the setting came from; settings that only make
//! sense together (credentials, mechanism and protocol) are checked by [`ClientConfig::apply`],
//! which writes them onto a [`LockOptions`].
//!
//! Every key is one of three kinds ([`key_kind`]):
//! - accepted: it means something to a lock and is applied;
//! - ignored: it means nothing to a lock (producer and consumer tuning found in shared
//!   client.properties files); it is listed in [`ClientConfig::warnings`];
//! - refused: it would change what the lock means (`group.id`: the lock's name is the group id),
//!   or asks for something kafka-lock does not do (Kerberos, Java key stores); an error says why.
//!
//! Any other key is an error naming it, with the nearest known key when one is close. Values of
//! secret keys (passwords, `sasl.jaas.config`) are never shown in errors, warnings or `Debug`.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::lock::LockOptions;
use crate::security::{
    Pem, Sasl, SaslMechanism, Secret, Security, SecurityProtocol, Tls, TlsProvider,
};

/// A settings error: the key it concerns is always named; the value only when the key is not a
/// secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The properties text is malformed (the only malformation `java.util.Properties` knows is a
    /// bad `\uXXXX` escape).
    #[error("{origin}: {message}")]
    Syntax {
        /// Where: a file name and line.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// The key is not one kafka-lock knows.
    #[error("unknown setting {} ({origin}){}", key_shown(.key), .suggestion.as_deref().map(|s| format!("; did you mean {s:?}?")).unwrap_or_default())]
    UnknownKey {
        /// The key as given.
        key: String,
        /// Where it was given.
        origin: String,
        /// The known key nearest to it, if one is close.
        suggestion: Option<String>,
    },
    /// The key is known but kafka-lock does not take it.
    #[error("setting {key:?} ({origin}) is not accepted: {reason}")]
    Refused {
        /// The key.
        key: String,
        /// Where it was given.
        origin: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The value is not one the key takes. `value` is `None` for secret keys.
    #[error("invalid value {} for {key:?} ({origin}): {expected}", .value.as_deref().map(|v| format!("{v:?}")).unwrap_or_else(|| "(secret, not shown)".into()))]
    BadValue {
        /// The key.
        key: String,
        /// The value, unless the key is a secret.
        value: Option<String>,
        /// Where it was given.
        origin: String,
        /// What the key takes.
        expected: String,
    },
    /// Settings that contradict each other, or one that needs another that is missing.
    #[error("{0}")]
    Conflict(String),
    /// A file could not be read.
    #[error("cannot read {path}: {message}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The operating system's error.
        message: String,
    },
}

/// An unknown key as an error may show it: quoted when it looks like a key name, otherwise not
/// at all, since it may be a piece of a value that ended up on a line of its own (the end of a
/// password continued without a backslash).
fn key_shown(key: &str) -> String {
    let looks_like_a_key = key.len() <= 64
        && key.contains('.')
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || matches!(c, '.' | '-' | '_'));
    if looks_like_a_key {
        format!("{key:?}")
    } else {
        format!(
            "(a key of {} characters, not shown: it does not look like a key name; is it part of \
             a value?)",
            key.chars().count()
        )
    }
}

impl From<ConfigError> for crate::Error {
    fn from(e: ConfigError) -> Self {
        crate::Error::Config(e.to_string())
    }
}

// ---------------------------------------------------------------------------------------------
// java.util.Properties text
// ---------------------------------------------------------------------------------------------

/// Parses properties text as `java.util.Properties.load` does: `key=value`, `key: value` or
/// `key value`; `#` and `!` comment lines; a line ending in an odd number of backslashes goes on
/// on the next line (whose leading blanks are dropped); escapes `\t \n \f \r \uXXXX`, and a
/// backslash before any other character stands for that character. Returns the pairs in file
/// order (a later pair of the same key wins when applied), each with the line number it starts
/// on; `origin` names the source in errors.
fn numbered_properties(
    text: &str,
    origin: &str,
) -> Result<Vec<(usize, String, String)>, ConfigError> {
    let mut out = Vec::new();
    for (line_no, logical) in logical_lines(text) {
        let at = || format!("{origin} line {line_no}");
        let (key, value) = split_key_value(&logical);
        // The text is never quoted back: a value, or what was meant as a key, may be a secret.
        let key = unescape(key).map_err(|at_char| ConfigError::Syntax {
            origin: at(),
            message: format!(
                "malformed \\uXXXX escape at character {} of the key",
                at_char + 1
            ),
        })?;
        let value = unescape(value).map_err(|at_char| ConfigError::Syntax {
            origin: at(),
            message: format!(
                "malformed \\uXXXX escape at character {} of the value of {}",
                at_char + 1,
                key_shown(&key)
            ),
        })?;
        out.push((line_no, key, value));
    }
    Ok(out)
}

/// Properties files are ISO 8859-1 to `Properties.load(InputStream)`, which Kafka's tools use
/// (`Utils.loadProps`); most are ASCII or, written by people today, UTF-8. Bytes that are valid
/// UTF-8 are read as UTF-8, others as ISO 8859-1. So ASCII, `\uXXXX` escapes and ISO 8859-1
/// files read as Java reads them, but a non-ASCII character saved as UTF-8 does not: Java reads
/// its two or more bytes as as many ISO 8859-1 characters (`ä` as `Ã¤`), a password the broker
/// never stored; here it is the character that was written (docs/cli.md).
pub fn decode_properties(bytes: &[u8]) -> Cow<'_, str> {
    match std::str::from_utf8(bytes) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => Cow::Owned(bytes.iter().map(|&b| char::from(b)).collect()),
    }
}

fn is_blank(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\x0c')
}

/// The logical lines (with their first natural line's number), comments and blank lines left
/// out, continuations joined; escapes are still in place.
fn logical_lines(text: &str) -> Vec<(usize, String)> {
    let mut natural = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        match rest.find(['\n', '\r']) {
            Some(i) => {
                natural.push(&rest[..i]);
                let skip = if rest[i..].starts_with("\r\n") { 2 } else { 1 };
                rest = &rest[i + skip..];
            }
            None => {
                natural.push(rest);
                rest = "";
            }
        }
    }
    let mut out = Vec::new();
    let mut i = 0;
    while i < natural.len() {
        let first = i;
        let line = natural[i].trim_start_matches(is_blank);
        i += 1;
        if line.is_empty() || line.starts_with(['#', '!']) {
            continue;
        }
        let mut logical = String::new();
        let mut part = line;
        loop {
            let trailing = part.len() - part.trim_end_matches('\\').len();
            if trailing % 2 == 1 {
                logical.push_str(&part[..part.len() - 1]);
                match natural.get(i) {
                    Some(next) => {
                        part = next.trim_start_matches(is_blank);
                        i += 1;
                    }
                    None => break,
                }
            } else {
                logical.push_str(part);
                break;
            }
        }
        out.push((first + 1, logical));
    }
    out
}

/// The raw key and raw value of a logical line: the key ends at the first unescaped `=`, `:` or
/// blank; blanks, then one `=` or `:`, then blanks separate it from the value.
fn split_key_value(line: &str) -> (&str, &str) {
    let mut escaped = false;
    let mut end = line.len();
    for (i, c) in line.char_indices() {
        if escaped {
            escaped = false;
            continue;
        }
        if c == '\\' {
            escaped = true;
        } else if c == '=' || c == ':' || is_blank(c) {
            end = i;
            break;
        }
    }
    let key = &line[..end];
    let mut rest = line[end..].trim_start_matches(is_blank);
    if let Some(r) = rest.strip_prefix(['=', ':']) {
        rest = r.trim_start_matches(is_blank);
    }
    (key, rest)
}

/// The unescaped text, or the position (in characters) of the backslash of a malformed
/// `\uXXXX` escape.
fn unescape(raw: &str) -> Result<String, usize> {
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars();
    let mut pos = 0usize;
    let mut pending_high: Option<u16> = None;
    let flush_high = |out: &mut String, high: &mut Option<u16>| {
        if high.take().is_some() {
            out.push(char::REPLACEMENT_CHARACTER);
        }
    };
    while let Some(c) = chars.next() {
        let at = pos;
        pos += 1;
        if c != '\\' {
            flush_high(&mut out, &mut pending_high);
            out.push(c);
            continue;
        }
        let Some(e) = chars.next() else {
            // A lone backslash at the very end (a continuation with nothing after it).
            break;
        };
        pos += 1;
        if e == 'u' {
            let hex: String = chars.by_ref().take(4).collect();
            pos += hex.chars().count();
            let unit = (hex.len() == 4 && hex.chars().all(|h| h.is_ascii_hexdigit()))
                .then(|| u16::from_str_radix(&hex, 16).ok())
                .flatten()
                .ok_or(at)?;
            // Java strings are UTF-16: a character outside the BMP is written as two escapes.
            match (pending_high.take(), unit) {
                (Some(high), 0xDC00..=0xDFFF) => {
                    let code =
                        0x10000 + ((u32::from(high) - 0xD800) << 10) + (u32::from(unit) - 0xDC00);
                    out.push(char::from_u32(code).unwrap_or(char::REPLACEMENT_CHARACTER));
                }
                (high, 0xD800..=0xDBFF) => {
                    if high.is_some() {
                        out.push(char::REPLACEMENT_CHARACTER);
                    }
                    pending_high = Some(unit);
                }
                (high, _) => {
                    if high.is_some() {
                        out.push(char::REPLACEMENT_CHARACTER);
                    }
                    out.push(
                        char::from_u32(u32::from(unit)).unwrap_or(char::REPLACEMENT_CHARACTER),
                    );
                }
            }
            continue;
        }
        flush_high(&mut out, &mut pending_high);
        out.push(match e {
            't' => '\t',
            'n' => '\n',
            'f' => '\x0c',
            'r' => '\r',
            other => other,
        });
    }
    flush_high(&mut out, &mut pending_high);
    Ok(out)
}

// ---------------------------------------------------------------------------------------------
// JAAS (sasl.jaas.config)
// ---------------------------------------------------------------------------------------------

/// The login module of a `sasl.jaas.config` value, whose grammar is Kafka's (`JaasConfig`):
/// `<class> <flag> (<name>=<value>)* ;` with values bare or quoted (`"` or `'`, with backslash
/// escapes), `//` and `/* */` comments, and exactly one module for a client.
#[derive(Clone, PartialEq, Eq)]
struct Jaas {
    module: String,
    options: Vec<(String, String)>,
}

impl fmt::Debug for Jaas {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.options.iter().map(|(k, _)| k.as_str()).collect();
        f.debug_struct("Jaas")
            .field("module", &self.module)
            .field("options", &names)
            .finish()
    }
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Quoted(String),
    Semicolon,
    Equals,
}

/// Kafka's JAAS tokenizer: bytes up to space are blanks, `/` starts a comment, `"` and `'`
/// quote, `;` and `=` stand alone, everything else makes words. Each token comes with the
/// position of its first character (from 1). Errors never quote the text, which holds a
/// password: they give positions.
fn jaas_tokens(s: &str) -> Result<Vec<(usize, Token)>, String> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let start = i;
        if c <= ' ' {
            i += 1;
        } else if c == '/' {
            match chars.get(i + 1) {
                Some('*') => {
                    i += 2;
                    loop {
                        if i >= chars.len() {
                            return Err(format!(
                                "the /* comment at character {} is not closed",
                                start + 1
                            ));
                        }
                        if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                            i += 2;
                            break;
                        }
                        i += 1;
                    }
                }
                _ => {
                    // `//` and a lone `/` both comment out the rest of the line.
                    while i < chars.len() && chars[i] != '\n' && chars[i] != '\r' {
                        i += 1;
                    }
                }
            }
        } else if c == ';' {
            out.push((start + 1, Token::Semicolon));
            i += 1;
        } else if c == '=' {
            out.push((start + 1, Token::Equals));
            i += 1;
        } else if c == '"' || c == '\'' {
            let quote = c;
            i += 1;
            let mut v = String::new();
            loop {
                let Some(&c) = chars.get(i) else {
                    return Err(format!(
                        "the quoted value at character {} is not closed",
                        start + 1
                    ));
                };
                i += 1;
                if c == quote {
                    break;
                }
                if c == '\n' || c == '\r' {
                    return Err(format!(
                        "the quoted value at character {} is not closed before the end of the line",
                        start + 1
                    ));
                }
                if c != '\\' {
                    v.push(c);
                    continue;
                }
                let Some(&e) = chars.get(i) else {
                    return Err(format!(
                        "the quoted value at character {} ends in a backslash",
                        start + 1
                    ));
                };
                i += 1;
                match e {
                    'a' => v.push('\x07'),
                    'b' => v.push('\x08'),
                    'f' => v.push('\x0c'),
                    'n' => v.push('\n'),
                    'r' => v.push('\r'),
                    't' => v.push('\t'),
                    'v' => v.push('\x0b'),
                    '0'..='7' => {
                        // Up to three octal digits, at most \377.
                        let mut n = e.to_digit(8).unwrap_or(0);
                        let max_digits = if e <= '3' { 3 } else { 2 };
                        let mut digits = 1;
                        while digits < max_digits {
                            match chars.get(i).and_then(|d| d.to_digit(8)) {
                                Some(d) => {
                                    n = n * 8 + d;
                                    i += 1;
                                    digits += 1;
                                }
                                None => break,
                            }
                        }
                        v.push(char::from_u32(n).unwrap_or(char::REPLACEMENT_CHARACTER));
                    }
                    other => v.push(other),
                }
            }
            out.push((start + 1, Token::Quoted(v)));
        } else {
            while i < chars.len()
                && chars[i] > ' '
                && !matches!(chars[i], '/' | ';' | '=' | '"' | '\'')
            {
                i += 1;
            }
            out.push((start + 1, Token::Word(chars[start..i].iter().collect())));
        }
    }
    Ok(out)
}

fn parse_jaas(s: &str) -> Result<Jaas, String> {
    let tokens = jaas_tokens(s)?;
    let end = s.chars().count() + 1;
    let mut it = tokens.into_iter().peekable();
    let mut modules = Vec::new();
    while let Some((at, t)) = it.next() {
        let module = match t {
            Token::Word(w) | Token::Quoted(w) => w,
            _ => {
                return Err(format!(
                    "expected a login module class name at character {at}"
                ))
            }
        };
        match it.next() {
            Some((_, Token::Word(flag))) | Some((_, Token::Quoted(flag)))
                if matches!(
                    flag.to_ascii_lowercase().as_str(),
                    "required" | "requisite" | "sufficient" | "optional"
                ) => {}
            Some((at, Token::Word(_))) | Some((at, Token::Quoted(_))) => {
                return Err(format!(
                    "the control flag at character {at} must be required, requisite, sufficient or optional"
                ))
            }
            next => {
                return Err(format!(
                    "no control flag (required) after the login module class name, at character {}",
                    next.map_or(end, |(at, _)| at)
                ))
            }
        }
        let mut options: Vec<(String, String)> = Vec::new();
        loop {
            match it.next() {
                Some((_, Token::Semicolon)) => break,
                None => return Err("the login module is not terminated by ';'".into()),
                Some((at, Token::Word(name))) | Some((at, Token::Quoted(name))) => {
                    if !matches!(it.next(), Some((_, Token::Equals))) {
                        return Err(format!(
                            "the option at character {at} has no '=' and value (is a value not quoted, or a ';' missing?)"
                        ));
                    }
                    match it.next() {
                        Some((_, Token::Word(v))) | Some((_, Token::Quoted(v))) => {
                            options.retain(|(k, _)| k != &name);
                            options.push((name, v));
                        }
                        _ => return Err(format!("the option at character {at} has no value")),
                    }
                }
                Some((at, _)) => {
                    return Err(format!(
                        "expected an option name=value or ';' at character {at}"
                    ))
                }
            }
        }
        modules.push(Jaas { module, options });
    }
    match modules.len() {
        0 => Err("no login module given".into()),
        1 => Ok(modules.remove(0)),
        n => Err(format!(
            "{n} login modules given; a client takes exactly one"
        )),
    }
}

// ---------------------------------------------------------------------------------------------
// Keys
// ---------------------------------------------------------------------------------------------

/// What kafka-lock does with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum KeyKind {
    /// Applied to the lock's options.
    Accepted,
    /// Meaningless for a lock; accepted with a warning and otherwise unused.
    Ignored,
    /// Refused with an error saying why.
    Refused,
    /// Not a key kafka-lock knows.
    Unknown,
}

/// Keys applied, with the names librdkafka uses for the same settings. Each maps to what
/// [`ClientConfig::set`] does with it.
pub const ACCEPTED_KEYS: &[&str] = &[
    "bootstrap.servers",
    "metadata.broker.list",
    "client.id",
    "security.protocol",
    "sasl.mechanism",
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "sasl.jaas.config",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.scope.claim.name",
    "sasl.oauthbearer.sub.claim.name",
    "sasl.oauthbearer.client.credentials.client.id",
    "sasl.oauthbearer.client.credentials.client.secret",
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.login.callback.handler.class",
    "https.ca.location",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.ca.pem",
    "ssl.certificate.pem",
    "ssl.key.pem",
    "ssl.truststore.certificates",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.truststore.location",
    "ssl.truststore.type",
    "ssl.keystore.location",
    "ssl.keystore.type",
    "ssl.endpoint.identification.algorithm",
    "enable.ssl.certificate.verification",
    "ssl.crypto.provider",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "max.poll.interval.ms",
    "request.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "retry.backoff.ms",
    "retry.backoff.max.ms",
    "group.protocol",
];

/// Keys of producers, consumers and clients in general that mean nothing for a lock: accepted
/// (so one client.properties serves every tool) with a warning.
pub const IGNORED_KEYS: &[&str] = &[
    // Consumer.
    "auto.offset.reset",
    "enable.auto.commit",
    "auto.commit.interval.ms",
    "fetch.min.bytes",
    "fetch.max.bytes",
    "fetch.max.wait.ms",
    "max.partition.fetch.bytes",
    "max.poll.records",
    "key.deserializer",
    "value.deserializer",
    "isolation.level",
    "check.crcs",
    "client.rack",
    "allow.auto.create.topics",
    "exclude.internal.topics",
    "interceptor.classes",
    "default.api.timeout.ms",
    // Producer.
    "acks",
    "linger.ms",
    "batch.size",
    "compression.type",
    "key.serializer",
    "value.serializer",
    "enable.idempotence",
    "max.in.flight.requests.per.connection",
    "retries",
    "delivery.timeout.ms",
    "buffer.memory",
    "max.request.size",
    "max.block.ms",
    "partitioner.class",
    // Every client.
    "metadata.max.age.ms",
    "reconnect.backoff.ms",
    "reconnect.backoff.max.ms",
    "socket.connection.setup.timeout.max.ms",
    "send.buffer.bytes",
    "receive.buffer.bytes",
    "connections.max.idle.ms",
    "client.dns.lookup",
    "metric.reporters",
    "metrics.num.samples",
    "metrics.recording.level",
    "metrics.sample.window.ms",
    "auto.include.jmx.reporter",
    "enable.metrics.push",
    // TLS tuning: rustls negotiates TLS 1.3 or 1.2 with its own safe cipher suites.
    "ssl.protocol",
    "ssl.enabled.protocols",
    "ssl.cipher.suites",
    "ssl.keymanager.algorithm",
    "ssl.trustmanager.algorithm",
    "ssl.secure.random.implementation",
    "ssl.truststore.password",
    "ssl.keystore.password",
    // OAUTHBEARER tuning: kafka-lock refreshes at 80 % of a token's life and retries with the
    // lock's own backoff.
    "sasl.login.refresh.window.factor",
    "sasl.login.refresh.window.jitter",
    "sasl.login.refresh.min.period.seconds",
    "sasl.login.refresh.buffer.seconds",
    "sasl.login.connect.timeout.ms",
    "sasl.login.read.timeout.ms",
    "sasl.login.retry.backoff.ms",
    "sasl.login.retry.backoff.max.ms",
    // librdkafka.
    "api.version.request",
    "broker.version.fallback",
    "statistics.interval.ms",
    "log_level",
    "debug",
];

/// Keys refused, with why.
const REFUSED: &[(&str, &str)] = &[
    ("group.id", "the lock's name is the group id; give it as the lock name (--lock)"),
    (
        "group.instance.id",
        "static membership would let a restarted holder take the lock back without a rebalance, \
         under the old generation; kafka-lock members are always dynamic",
    ),
    (
        "partition.assignment.strategy",
        "kafka-lock chooses its own assignors (sticky-FIFO, or cooperative-sticky, range and \
         roundrobin in consumer-compatible mode)",
    ),
    (
        "transactional.id",
        "kafka-lock does not use transactions; its fencing token comes from the group or the ledger",
    ),
    (
        "ssl.key.password",
        "encrypted private keys are not supported; give ssl.key.location an unencrypted PEM key \
         (openssl pkey -in KEY -out PLAIN.pem) kept readable only by its owner",
    ),
    (
        "ssl.engine.factory.class",
        "kafka-lock's TLS is rustls; Java classes cannot be loaded",
    ),
    (
        "sasl.client.callback.handler.class",
        "Java callback handlers (such as AWS MSK IAM's) cannot be loaded; use SCRAM or PLAIN",
    ),
    (
        "sasl.login.class",
        "Java login classes cannot be loaded; use sasl.jaas.config or sasl.username/sasl.password",
    ),
    (
        "sasl.kerberos.service.name",
        "Kerberos (GSSAPI) is not supported; use SCRAM or PLAIN",
    ),
];

/// What kafka-lock does with `key`.
pub fn key_kind(key: &str) -> KeyKind {
    if ACCEPTED_KEYS.contains(&key) {
        KeyKind::Accepted
    } else if IGNORED_KEYS.contains(&key) {
        KeyKind::Ignored
    } else if REFUSED.iter().any(|(k, _)| *k == key) {
        KeyKind::Refused
    } else {
        KeyKind::Unknown
    }
}

/// Every key kafka-lock knows, of any kind other than unknown.
pub fn known_keys() -> impl Iterator<Item = &'static str> {
    ACCEPTED_KEYS
        .iter()
        .chain(IGNORED_KEYS)
        .copied()
        .chain(REFUSED.iter().map(|(k, _)| *k))
}

/// Whether values of `key` are secrets, never shown.
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("password")
        || k.contains("secret")
        || k.contains("jaas")
        || k.contains("token")
        || (k.starts_with("ssl.key") && !k.ends_with("location") && !k.ends_with("type"))
}

fn edit_distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.chars().collect();
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

/// The known key nearest to `key`, when it is near enough to be a slip.
pub fn suggest(key: &str) -> Option<&'static str> {
    if key.len() > 200 {
        return None;
    }
    let lower = key.to_ascii_lowercase().replace(['_', '-'], ".");
    known_keys()
        .map(|k| (edit_distance(&lower, k), k))
        .filter(|(d, k)| *d <= 2.max(k.len() / 6))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

// ---------------------------------------------------------------------------------------------
// Settings
// ---------------------------------------------------------------------------------------------

/// One setting with where it came from.
#[derive(Debug, Clone)]
struct Set<T> {
    value: T,
    origin: String,
}

/// The timing settings given, as durations; `None` where a key was not set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Timeouts {
    /// `session.timeout.ms`.
    pub session: Option<Duration>,
    /// `heartbeat.interval.ms`.
    pub heartbeat: Option<Duration>,
    /// `max.poll.interval.ms`: the Java consumer sends it as its rebalance timeout, and so does
    /// kafka-lock.
    pub rebalance: Option<Duration>,
    /// `request.timeout.ms`.
    pub request: Option<Duration>,
    /// `socket.connection.setup.timeout.ms`: kafka-lock's connect timeout (TCP, TLS, version
    /// and SASL handshakes).
    pub connect: Option<Duration>,
    /// `retry.backoff.ms`.
    pub retry_backoff: Option<Duration>,
    /// `retry.backoff.max.ms`.
    pub retry_backoff_max: Option<Duration>,
}

/// Kafka client settings in Kafka's vocabulary, collected from properties text and single
/// settings; see the module's documentation (`src/config.rs`).
#[derive(Debug, Clone, Default)]
pub struct ClientConfig {
    bootstrap: Option<Set<String>>,
    client_id: Option<Set<String>>,
    protocol: Option<Set<SecurityProtocol>>,
    mechanism: Option<Set<SaslMechanism>>,
    username: Option<Set<String>>,
    password: Option<Set<Secret>>,
    jaas: Option<Set<Jaas>>,
    /// Where `sasl.mechanism=OAUTHBEARER` was given (`mechanism` is then `None`).
    oauthbearer: Option<String>,
    /// The `sasl.oauthbearer.*` settings (and `https.ca.location`), by key.
    oauth: BTreeMap<&'static str, Set<String>>,
    ca: Option<Set<Pem>>,
    certificate: Option<Set<Pem>>,
    key: Option<Set<Pem>>,
    truststore: Option<Set<PathBuf>>,
    truststore_type: Option<Set<String>>,
    keystore: Option<Set<PathBuf>>,
    keystore_type: Option<Set<String>>,
    verify_hostname: Option<Set<bool>>,
    tls_provider: Option<Set<TlsProvider>>,
    timeouts: BTreeMap<&'static str, Set<Duration>>,
    ignored: Vec<(String, String)>,
}

impl ClientConfig {
    /// No settings: Kafka's defaults (PLAINTEXT).
    pub fn new() -> Self {
        Self::default()
    }

    /// Settings from properties text; `origin` (a file name) is used in errors.
    pub fn from_properties(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let mut c = Self::new();
        c.load_properties(text, origin)?;
        Ok(c)
    }

    /// Settings from a properties file (UTF-8, or ISO 8859-1 as Java reads it).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// let options = kafka_lock::ClientConfig::from_file("client.properties")?
    ///     .lock_options("nightly")?;
    /// # let _ = options;
    /// # Ok(())
    /// # }
    /// ```
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, ConfigError> {
        let mut c = Self::new();
        c.load_file(path)?;
        Ok(c)
    }

    /// Adds the settings of a properties file, replacing earlier settings of the same keys.
    pub fn load_file(&mut self, path: impl AsRef<Path>) -> Result<(), ConfigError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|e| ConfigError::Io {
            path: path.to_owned(),
            message: e.to_string(),
        })?;
        self.load_properties(&decode_properties(&bytes), &path.display().to_string())
    }

    /// Adds the settings of properties text, replacing earlier settings of the same keys.
    pub fn load_properties(&mut self, text: &str, origin: &str) -> Result<(), ConfigError> {
        for (line, key, value) in numbered_properties(text, origin)? {
            self.set_from(&key, &value, &format!("{origin} line {line}"))?;
        }
        Ok(())
    }

    /// Adds one setting, replacing an earlier setting of the same key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<(), ConfigError> {
        self.set_from(key, value, "set")
    }

    /// Adds one setting; `origin` says where it came from (`-X`, a variable's name), for errors.
    pub fn set_from(&mut self, key: &str, value: &str, origin: &str) -> Result<(), ConfigError> {
        if let Some((key, setter)) = PROPERTIES.iter().find(|(k, _)| *k == key) {
            return setter(self, &Given { key, value, origin });
        }
        let origin = origin.to_owned();
        match key_kind(key) {
            KeyKind::Ignored => {
                self.ignored.retain(|(k, _)| k != key);
                self.ignored.push((key.to_owned(), origin));
                Ok(())
            }
            KeyKind::Refused => {
                let reason = REFUSED
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map(|(_, r)| *r)
                    .unwrap_or("it is not supported");
                Err(ConfigError::Refused {
                    key: key.to_owned(),
                    origin,
                    reason: reason.to_owned(),
                })
            }
            _ => Err(ConfigError::UnknownKey {
                key: key.to_owned(),
                origin,
                suggestion: suggest(key).map(str::to_owned),
            }),
        }
    }

    /// `bootstrap.servers`, if set.
    pub fn bootstrap_servers(&self) -> Option<&str> {
        self.bootstrap.as_ref().map(|s| s.value.as_str())
    }

    /// `client.id`, if set.
    pub fn client_id(&self) -> Option<&str> {
        self.client_id.as_ref().map(|s| s.value.as_str())
    }

    /// The timing settings given.
    pub fn timeouts(&self) -> Timeouts {
        let get = |k: &str| self.timeouts.get(k).map(|s| s.value);
        Timeouts {
            session: get("session.timeout.ms"),
            heartbeat: get("heartbeat.interval.ms"),
            rebalance: get("max.poll.interval.ms"),
            request: get("request.timeout.ms"),
            connect: get("socket.connection.setup.timeout.ms"),
            retry_backoff: get("retry.backoff.ms"),
            retry_backoff_max: get("retry.backoff.max.ms"),
        }
    }

    /// Lines to show the person who gave the settings: keys ignored, host name checks turned
    /// off, a PLAIN password sent without TLS.
    pub fn warnings(&self) -> Vec<String> {
        let mut w: Vec<String> = self
            .ignored
            .iter()
            .map(|(k, o)| format!("setting {k:?} ({o}) means nothing for a lock and is ignored"))
            .collect();
        if let Some(Set {
            value: false,
            origin,
        }) = &self.verify_hostname
        {
            w.push(format!(
                "ssl.endpoint.identification.algorithm is empty ({origin}): the broker's certificate \
                 is not checked against its host name, so anyone with a certificate from the same CA \
                 can pose as the broker"
            ));
        }
        if let (Some(p), Some(m)) = (&self.protocol, &self.mechanism) {
            if p.value == SecurityProtocol::SaslPlaintext && m.value == SaslMechanism::Plain {
                w.push(format!(
                    "sasl.mechanism=PLAIN ({}) with security.protocol=SASL_PLAINTEXT ({}) sends the \
                     password over the network unencrypted; use SASL_SSL, or SCRAM",
                    m.origin, p.origin
                ));
            }
        }
        w
    }

    /// The security settings, checked for consistency: credentials come from exactly one of
    /// `sasl.jaas.config` and `sasl.username`/`sasl.password`, the login module fits
    /// `sasl.mechanism`, and no SASL or TLS setting is given for a protocol that does not use it.
    pub fn security(&self) -> Result<Security, ConfigError> {
        let protocol = self
            .protocol
            .as_ref()
            .map_or(SecurityProtocol::Plaintext, |p| p.value);
        let protocol_from = self
            .protocol
            .as_ref()
            .map_or("the default".to_owned(), |p| format!("from {}", p.origin));
        let conflict = |m: String| Err(ConfigError::Conflict(m));

        let sasl_given: Vec<(&str, &str)> = [
            (
                "sasl.mechanism",
                self.mechanism
                    .as_ref()
                    .map(|s| s.origin.as_str())
                    .or(self.oauthbearer.as_deref()),
            ),
            (
                "sasl.username",
                self.username.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "sasl.password",
                self.password.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "sasl.jaas.config",
                self.jaas.as_ref().map(|s| s.origin.as_str()),
            ),
        ]
        .into_iter()
        .filter_map(|(k, o)| o.map(|o| (k, o)))
        .collect();
        let tls_given: Vec<(&str, &str)> = [
            (
                "ssl.ca.location",
                self.ca.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "ssl.certificate.location",
                self.certificate.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "ssl.key.location",
                self.key.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "ssl.truststore.location",
                self.truststore.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "ssl.keystore.location",
                self.keystore.as_ref().map(|s| s.origin.as_str()),
            ),
            (
                "ssl.endpoint.identification.algorithm",
                self.verify_hostname
                    .as_ref()
                    .filter(|s| !s.value)
                    .map(|s| s.origin.as_str()),
            ),
        ]
        .into_iter()
        .filter_map(|(k, o)| o.map(|o| (k, o)))
        .collect();

        if !protocol.uses_sasl() {
            if let Some((k, o)) = sasl_given.first() {
                let want = if protocol.uses_tls() {
                    "SASL_SSL"
                } else {
                    "SASL_SSL (or SASL_PLAINTEXT)"
                };
                return conflict(format!(
                    "{k} is set ({o}) but security.protocol is {} ({protocol_from}), which does not \
                     authenticate with SASL; set security.protocol={want}",
                    protocol.as_str()
                ));
            }
        }
        if !protocol.uses_tls() {
            if let Some((k, o)) = tls_given.first() {
                let want = if protocol.uses_sasl() {
                    "SASL_SSL"
                } else {
                    "SSL (or SASL_SSL)"
                };
                return conflict(format!(
                    "{k} is set ({o}) but security.protocol is {} ({protocol_from}), which does not \
                     use TLS; set security.protocol={want}",
                    protocol.as_str()
                ));
            }
        }

        let tls = if protocol.uses_tls() {
            Some(self.tls()?)
        } else {
            None
        };
        let sasl = if protocol.uses_sasl() {
            Some(self.sasl()?)
        } else {
            None
        };
        let mut security = Security::new(protocol);
        if let Some(t) = tls {
            security = security.with_tls(t);
        }
        if let Some(s) = sasl {
            security = security.with_sasl(s);
        }
        Ok(security)
    }

    fn sasl(&self) -> Result<Sasl, ConfigError> {
        let conflict = |m: String| Err(ConfigError::Conflict(m));
        if let Some(origin) = &self.oauthbearer {
            return self.oauth_sasl(origin);
        }
        if let Some((k, s)) = self.oauth.iter().next() {
            return conflict(format!(
                "{k} is set ({}) but sasl.mechanism is not OAUTHBEARER; set sasl.mechanism=OAUTHBEARER",
                s.origin
            ));
        }
        let Some(mechanism) = &self.mechanism else {
            return conflict(
                "security.protocol asks for SASL but sasl.mechanism is not set (Kafka's default, \
                 GSSAPI, is not supported); set sasl.mechanism to PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
                    .into(),
            );
        };
        let m = mechanism.value;
        match (&self.jaas, &self.username, &self.password) {
            (Some(jaas), None, None) => {
                let expected = match m {
                    SaslMechanism::Plain => "org.apache.kafka.common.security.plain.PlainLoginModule",
                    _ => "org.apache.kafka.common.security.scram.ScramLoginModule",
                };
                if jaas.value.module != expected {
                    return conflict(format!(
                        "sasl.jaas.config ({}) uses the login module {} but sasl.mechanism is {} ({}); \
                         {} takes {expected}",
                        jaas.origin,
                        jaas.value.module,
                        m.as_str(),
                        mechanism.origin,
                        m.as_str()
                    ));
                }
                let mut username = None;
                let mut password = None;
                for (k, v) in &jaas.value.options {
                    match k.as_str() {
                        "username" => username = Some(v.clone()),
                        "password" => password = Some(v.clone()),
                        "tokenauth" if m != SaslMechanism::Plain => {
                            if v.eq_ignore_ascii_case("true") {
                                return conflict(format!(
                                    "sasl.jaas.config ({}) asks for delegation-token authentication \
                                     (tokenauth=true), which kafka-lock does not support",
                                    jaas.origin
                                ));
                            }
                        }
                        other => {
                            return conflict(format!(
                                "sasl.jaas.config ({}) has the option {other:?}, which {} does not \
                                 take; it takes username and password",
                                jaas.origin,
                                jaas.value.module.rsplit('.').next().unwrap_or_default()
                            ))
                        }
                    }
                }
                match (username, password) {
                    (Some(username), Some(password)) => {
                        Ok(Sasl::new(m, username, Secret::new(password)))
                    }
                    (None, _) => conflict(format!(
                        "sasl.jaas.config ({}) has no username option",
                        jaas.origin
                    )),
                    (_, None) => conflict(format!(
                        "sasl.jaas.config ({}) has no password option",
                        jaas.origin
                    )),
                }
            }
            (Some(jaas), Some(Set { origin: o, .. }), _) => {
                let k = "sasl.username";
                conflict(format!(
                    "both sasl.jaas.config ({}) and {k} ({o}) give credentials; use one: \
                     sasl.username and sasl.password, or sasl.jaas.config",
                    jaas.origin
                ))
            }
            (Some(jaas), None, Some(Set { origin: o, .. })) => {
                let k = "sasl.password";
                conflict(format!(
                    "both sasl.jaas.config ({}) and {k} ({o}) give credentials; use one: \
                     sasl.username and sasl.password, or sasl.jaas.config",
                    jaas.origin
                ))
            }
            (None, Some(u), Some(p)) => Ok(Sasl::new(m, u.value.clone(), p.value.clone())),
            (None, None, Some(_)) => conflict(
                "sasl.password is set but sasl.username is not; set both (or sasl.jaas.config)"
                    .into(),
            ),
            (None, Some(_), None) => conflict(
                "sasl.username is set but sasl.password is not; set it, for instance from the \
                 environment (KAFKA_LOCK_X_SASL_PASSWORD for the kafka-lock command), so it stays \
                 off the command line"
                    .into(),
            ),
            (None, None, None) => conflict(
                "security.protocol asks for SASL but no credentials are given; set sasl.username and \
                 sasl.password, or sasl.jaas.config"
                    .into(),
            ),
        }
    }

    /// OAUTHBEARER's settings: the token endpoint, and the client credentials from
    /// `sasl.jaas.config` (Kafka's `OAuthBearerLoginModule` with `clientId`, `clientSecret`,
    /// `scope`, `extension_<name>`) or from Kafka 4.1's and librdkafka's keys, not both.
    #[cfg(feature = "oauth")]
    fn oauth_sasl(&self, origin: &str) -> Result<Sasl, ConfigError> {
        use crate::oauth::OAuthBearer;
        let conflict = |m: String| Err(ConfigError::Conflict(m));
        let get = |k: &str| self.oauth.get(k);
        if let Some((k, s)) = [("sasl.username", &self.username)]
            .into_iter()
            .find_map(|(k, s)| s.as_ref().map(|s| (k, s)))
        {
            return conflict(format!(
                "{k} is set ({}) but sasl.mechanism is OAUTHBEARER ({origin}), which takes \
                 clientId and clientSecret in sasl.jaas.config",
                s.origin
            ));
        }
        if let Some(p) = &self.password {
            return conflict(format!(
                "sasl.password is set ({}) but sasl.mechanism is OAUTHBEARER ({origin}), which \
                 takes clientId and clientSecret in sasl.jaas.config",
                p.origin
            ));
        }
        let Some(endpoint) = get("sasl.oauthbearer.token.endpoint.url") else {
            return conflict(format!(
                "sasl.mechanism=OAUTHBEARER ({origin}) needs sasl.oauthbearer.token.endpoint.url \
                 (kafka-lock gets tokens with the client credentials grant)"
            ));
        };
        let mut id = get("sasl.oauthbearer.client.credentials.client.id").map(|s| s.value.clone());
        let mut secret =
            get("sasl.oauthbearer.client.credentials.client.secret").map(|s| s.value.clone());
        let mut scope = get("sasl.oauthbearer.scope").map(|s| s.value.clone());
        let mut extensions = Vec::new();
        if let Some(jaas) = &self.jaas {
            let expected = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule";
            if jaas.value.module != expected {
                return conflict(format!(
                    "sasl.jaas.config ({}) uses the login module {} but sasl.mechanism is \
                     OAUTHBEARER ({origin}); OAUTHBEARER takes {expected}",
                    jaas.origin, jaas.value.module
                ));
            }
            for (k, v) in &jaas.value.options {
                let from_jaas = |slot: &mut Option<String>, key: &str| {
                    if let Some(s) = get(key) {
                        return Err(ConfigError::Conflict(format!(
                            "both sasl.jaas.config ({}) and {key} ({}) give {k}; use one",
                            jaas.origin, s.origin
                        )));
                    }
                    *slot = Some(v.clone());
                    Ok(())
                };
                match k.as_str() {
                    "clientId" => {
                        from_jaas(&mut id, "sasl.oauthbearer.client.credentials.client.id")?
                    }
                    "clientSecret" => from_jaas(
                        &mut secret,
                        "sasl.oauthbearer.client.credentials.client.secret",
                    )?,
                    "scope" => from_jaas(&mut scope, "sasl.oauthbearer.scope")?,
                    other if other.starts_with("extension_") => {
                        extensions.push((other["extension_".len()..].to_owned(), v.clone()))
                    }
                    // Kafka's unsecured-token options make the client sign its own tokens.
                    other if other.starts_with("unsecuredLogin") => {
                        return conflict(format!(
                            "sasl.jaas.config ({}) asks for unsecured tokens ({other}), which \
                             kafka-lock does not make; give clientId and clientSecret and \
                             sasl.oauthbearer.token.endpoint.url",
                            jaas.origin
                        ))
                    }
                    other => {
                        return conflict(format!(
                            "sasl.jaas.config ({}) has the option {other:?}, which \
                             OAuthBearerLoginModule does not take here; it takes clientId, \
                             clientSecret, scope and extension_<name>",
                            jaas.origin
                        ))
                    }
                }
            }
        }
        let (Some(id), Some(secret)) = (id, secret) else {
            return conflict(format!(
                "sasl.mechanism=OAUTHBEARER ({origin}) needs the client credentials: clientId and \
                 clientSecret in sasl.jaas.config (org.apache.kafka.common.security.oauthbearer.\
                 OAuthBearerLoginModule required clientId=\"...\" clientSecret=\"...\";)"
            ));
        };
        let config_error = |e: crate::Error| {
            ConfigError::Conflict(match e {
                crate::Error::Config(m) => m,
                other => other.to_string(),
            })
        };
        let mut oauth = OAuthBearer::client_credentials(&endpoint.value, id, Secret::new(secret))
            .map_err(config_error)?;
        if let Some(scope) = scope {
            oauth = oauth.scope(scope);
        }
        if let Some(s) = get("sasl.oauthbearer.sub.claim.name") {
            oauth = oauth.sub_claim(&s.value);
        }
        if let Some(s) = get("sasl.oauthbearer.scope.claim.name") {
            oauth = oauth.scope_claim(&s.value);
        }
        if let Some(s) = get("https.ca.location") {
            oauth = oauth.ca(Pem::File(PathBuf::from(&s.value)));
        }
        if let Some(p) = &self.tls_provider {
            oauth = oauth.crypto_provider(p.value);
        }
        for (k, v) in extensions {
            oauth = oauth.extension(&k, &v).map_err(config_error)?;
        }
        Ok(Sasl::oauthbearer(oauth))
    }

    #[cfg(not(feature = "oauth"))]
    fn oauth_sasl(&self, origin: &str) -> Result<Sasl, ConfigError> {
        Err(ConfigError::Conflict(format!(
            "sasl.mechanism=OAUTHBEARER ({origin}) needs a kafka-lock built with the `oauth` \
             cargo feature"
        )))
    }

    fn tls(&self) -> Result<Tls, ConfigError> {
        let conflict = |m: String| Err(ConfigError::Conflict(m));
        let store_type =
            |t: &Option<Set<String>>| t.as_ref().map_or("JKS", |s| s.value.as_str()).to_owned();
        let mut ca = self.ca.as_ref().map(|s| s.value.clone());
        if let Some(ts) = &self.truststore {
            let t = store_type(&self.truststore_type);
            if t != "PEM" {
                return conflict(format!(
                    "ssl.truststore.location ({}) is a {t} store, which kafka-lock cannot read; set \
                     ssl.truststore.type=PEM for a PEM file, or export the CA certificates \
                     (keytool -exportcert -rfc -keystore STORE -alias ALIAS > ca.pem) and give them \
                     with ssl.ca.location",
                    ts.origin
                ));
            }
            if let Some(c) = &self.ca {
                return conflict(format!(
                    "both ssl.ca.location ({}) and ssl.truststore.location ({}) name the CA \
                     certificates; use one",
                    c.origin, ts.origin
                ));
            }
            ca = Some(Pem::File(ts.value.clone()));
        }
        let mut client = match (&self.certificate, &self.key) {
            (Some(c), Some(k)) => Some((c.value.clone(), k.value.clone())),
            (Some(c), None) => {
                return conflict(format!(
                    "ssl.certificate.location is set ({}) but ssl.key.location is not; a client \
                     certificate needs its private key",
                    c.origin
                ))
            }
            (None, Some(k)) => {
                return conflict(format!(
                    "ssl.key.location is set ({}) but ssl.certificate.location is not; a private \
                     key needs its certificate",
                    k.origin
                ))
            }
            (None, None) => None,
        };
        if let Some(ks) = &self.keystore {
            let t = store_type(&self.keystore_type);
            if t != "PEM" {
                return conflict(format!(
                    "ssl.keystore.location ({}) is a {t} store, which kafka-lock cannot read; set \
                     ssl.keystore.type=PEM for a PEM file holding the private key and certificate, \
                     or give them with ssl.certificate.location and ssl.key.location",
                    ks.origin
                ));
            }
            if client.is_some() {
                return conflict(format!(
                    "both ssl.keystore.location ({}) and ssl.certificate.location/ssl.key.location \
                     name the client certificate; use one",
                    ks.origin
                ));
            }
            client = Some((Pem::File(ks.value.clone()), Pem::File(ks.value.clone())));
        }
        let mut tls = Tls::new();
        tls.ca = ca;
        tls.client_cert = client;
        if self.verify_hostname.as_ref().is_some_and(|s| !s.value) {
            tls = tls.dangerous_disable_hostname_verification();
        }
        if let Some(p) = &self.tls_provider {
            tls = tls.crypto_provider(p.value);
        }
        Ok(tls)
    }

    /// Writes the settings onto `opts`: the bootstrap servers and client id if given, the timing
    /// settings given, and the security settings (checked as [`ClientConfig::security`] does).
    pub fn apply(&self, mut opts: LockOptions) -> Result<LockOptions, ConfigError> {
        let security = self.security()?;
        if let Some(b) = self.bootstrap_servers() {
            opts = opts.set_bootstrap(b);
        }
        if let Some(id) = self.client_id() {
            opts = opts.client_id(id);
        }
        let t = self.timeouts();
        if let Some(d) = t.session {
            opts = opts.session_timeout(d);
        }
        if let Some(d) = t.heartbeat {
            opts = opts.heartbeat_interval(d);
        }
        if let Some(d) = t.rebalance {
            opts = opts.rebalance_timeout(d);
        }
        if let Some(d) = t.request {
            opts = opts.request_timeout(d);
        }
        if let Some(d) = t.connect {
            opts = opts.connect_timeout(d);
        }
        if t.retry_backoff.is_some() || t.retry_backoff_max.is_some() {
            let (initial, max) = opts.retry_backoff_bounds();
            opts = opts.retry_backoff(
                t.retry_backoff.unwrap_or(initial),
                t.retry_backoff_max.unwrap_or(max),
            );
        }
        Ok(opts.security(security))
    }

    /// Options for the lock `name` on the cluster of `bootstrap.servers`, with these settings.
    pub fn lock_options(&self, name: impl Into<String>) -> Result<LockOptions, ConfigError> {
        let Some(bootstrap) = self.bootstrap_servers() else {
            return Err(ConfigError::Conflict(
                "bootstrap.servers is not set; give the brokers to start from as host:port[,host:port...]".into(),
            ));
        };
        self.apply(LockOptions::new(bootstrap, name))
    }
}

// ---------------------------------------------------------------------------------------------
// Accepted properties: each key with the function that parses its value and stores it
// ---------------------------------------------------------------------------------------------

/// One property being set: its key (as [`PROPERTIES`] spells it), the value as given, and where
/// it came from.
struct Given<'a> {
    key: &'static str,
    value: &'a str,
    origin: &'a str,
}

impl Given<'_> {
    fn set<T>(&self, value: T) -> Option<Set<T>> {
        Some(Set {
            value,
            origin: self.origin.to_owned(),
        })
    }

    /// The value does not parse; `expected` says what would. Secrets are not repeated.
    fn bad(&self, expected: &str) -> ConfigError {
        ConfigError::BadValue {
            key: self.key.to_owned(),
            value: (!is_secret(self.key)).then(|| self.value.to_owned()),
            origin: self.origin.to_owned(),
            expected: expected.to_owned(),
        }
    }

    fn refused(&self, reason: &str) -> ConfigError {
        ConfigError::Refused {
            key: self.key.to_owned(),
            origin: self.origin.to_owned(),
            reason: reason.to_owned(),
        }
    }
}

type Setter = fn(&mut ClientConfig, &Given<'_>) -> Result<(), ConfigError>;

/// Every key of [`ACCEPTED_KEYS`], in its order (a test checks both), with its setter. Aliases
/// (librdkafka's names, Java's store names) share their setter.
const PROPERTIES: &[(&str, Setter)] = &[
    ("bootstrap.servers", bootstrap),
    ("metadata.broker.list", bootstrap),
    ("client.id", |c, g| {
        c.client_id = g.set(g.value.to_owned());
        Ok(())
    }),
    ("security.protocol", security_protocol),
    ("sasl.mechanism", sasl_mechanism),
    ("sasl.mechanisms", sasl_mechanism),
    ("sasl.username", |c, g| {
        c.username = g.set(g.value.to_owned());
        Ok(())
    }),
    ("sasl.password", |c, g| {
        c.password = g.set(Secret::new(g.value));
        Ok(())
    }),
    ("sasl.jaas.config", sasl_jaas_config),
    ("sasl.oauthbearer.token.endpoint.url", oauth),
    ("sasl.oauthbearer.scope", oauth),
    ("sasl.oauthbearer.scope.claim.name", oauth),
    ("sasl.oauthbearer.sub.claim.name", oauth),
    ("sasl.oauthbearer.client.credentials.client.id", oauth),
    ("sasl.oauthbearer.client.credentials.client.secret", oauth),
    ("sasl.oauthbearer.method", oauthbearer_method),
    ("sasl.oauthbearer.client.id", oauth),
    ("sasl.oauthbearer.client.secret", oauth),
    ("sasl.login.callback.handler.class", login_callback_handler),
    ("https.ca.location", oauth),
    ("ssl.ca.location", ssl_ca_location),
    ("ssl.certificate.location", |c, g| {
        c.certificate = g.set(pem_file(g, "a PEM file of the client's certificate")?);
        Ok(())
    }),
    ("ssl.key.location", |c, g| {
        c.key = g.set(pem_file(g, "a PEM file of the client's private key")?);
        Ok(())
    }),
    ("ssl.ca.pem", |c, g| {
        c.ca = g.set(pem_text(g, "PEM text of CA certificates")?);
        Ok(())
    }),
    ("ssl.certificate.pem", |c, g| {
        c.certificate = g.set(pem_text(g, "PEM text of the client's certificate")?);
        Ok(())
    }),
    ("ssl.key.pem", |c, g| {
        c.key = g.set(pem_text(g, "PEM text of the client's private key")?);
        Ok(())
    }),
    ("ssl.truststore.certificates", |c, g| {
        c.ca = g.set(pem_text(g, "PEM text of CA certificates")?);
        Ok(())
    }),
    ("ssl.keystore.certificate.chain", |c, g| {
        c.certificate = g.set(pem_text(g, "PEM text of the client's certificate")?);
        Ok(())
    }),
    ("ssl.keystore.key", |c, g| {
        c.key = g.set(pem_text(g, "PEM text of the client's private key")?);
        Ok(())
    }),
    ("ssl.truststore.location", |c, g| {
        let file = path(g.value).ok_or_else(|| g.bad("a PEM file of CA certificates"))?;
        c.truststore = g.set(file);
        Ok(())
    }),
    ("ssl.truststore.type", |c, g| {
        c.truststore_type = g.set(store_type(g)?);
        Ok(())
    }),
    ("ssl.keystore.location", |c, g| {
        let file = path(g.value)
            .ok_or_else(|| g.bad("a PEM file with the client's private key and certificate"))?;
        c.keystore = g.set(file);
        Ok(())
    }),
    ("ssl.keystore.type", |c, g| {
        c.keystore_type = g.set(store_type(g)?);
        Ok(())
    }),
    (
        "ssl.endpoint.identification.algorithm",
        endpoint_identification,
    ),
    ("enable.ssl.certificate.verification", |_, g| {
        match g.value.trim() {
        "true" => Ok(()),
        "false" => Err(g.refused(
            "kafka-lock always checks the broker's certificate; give the CA that signed it with \
             ssl.ca.location",
        )),
        _ => Err(g.bad("true")),
    }
    }),
    ("ssl.crypto.provider", crypto_provider),
    ("session.timeout.ms", timeout),
    ("heartbeat.interval.ms", timeout),
    ("max.poll.interval.ms", timeout),
    ("request.timeout.ms", timeout),
    ("socket.connection.setup.timeout.ms", timeout),
    ("retry.backoff.ms", timeout),
    ("retry.backoff.max.ms", timeout),
    ("group.protocol", |_, g| {
        if g.value.trim().eq_ignore_ascii_case("classic") {
            Ok(())
        } else {
            Err(g
                .bad("classic: kafka-lock speaks the classic group protocol (JoinGroup/SyncGroup)"))
        }
    }),
];

fn bootstrap(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let v = g.value.trim();
    if v.is_empty() {
        return Err(g.bad("a list of host:port, separated by commas"));
    }
    c.bootstrap = g.set(v.to_owned());
    Ok(())
}

fn security_protocol(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let p: SecurityProtocol = g
        .value
        .parse()
        .map_err(|_| g.bad("PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"))?;
    c.protocol = g.set(p);
    Ok(())
}

fn sasl_mechanism(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let m = match g.value.trim() {
        "PLAIN" => SaslMechanism::Plain,
        "SCRAM-SHA-256" => SaslMechanism::ScramSha256,
        "SCRAM-SHA-512" => SaslMechanism::ScramSha512,
        "GSSAPI" => return Err(g.bad("PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512; Kerberos (GSSAPI) is not supported")),
        "OAUTHBEARER" => {
            c.mechanism = None;
            c.oauthbearer = Some(g.origin.to_owned());
            return Ok(());
        }
        "AWS_MSK_IAM" => return Err(g.bad("PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 or OAUTHBEARER; AWS_MSK_IAM is not supported by kafka-lock's settings")),
        other => {
            let upper = other.to_ascii_uppercase().replace('_', "-");
            let hint = match upper.as_str() {
                "PLAIN" | "SCRAM-SHA-256" | "SCRAM-SHA-512" => {
                    format!("mechanism names are upper case: {upper}")
                }
                _ => "PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512".to_owned(),
            };
            return Err(g.bad(&hint));
        }
    };
    c.oauthbearer = None;
    c.mechanism = g.set(m);
    Ok(())
}

fn sasl_jaas_config(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let jaas = parse_jaas(g.value).map_err(|m| g.bad(&format!(
        "{m} (the form is: org.apache.kafka.common.security.scram.ScramLoginModule required username=\"...\" password=\"...\";)"
    )))?;
    c.jaas = g.set(jaas);
    Ok(())
}

/// The `sasl.oauthbearer.*` settings and `https.ca.location`, kept by key for the OAuth client.
fn oauth(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    if g.value.trim().is_empty() {
        return Err(g.bad("a value"));
    }
    // librdkafka's names for the client credentials are Kafka 4.1's.
    let k = match g.key {
        "sasl.oauthbearer.client.id" => "sasl.oauthbearer.client.credentials.client.id",
        "sasl.oauthbearer.client.secret" => "sasl.oauthbearer.client.credentials.client.secret",
        k => k,
    };
    c.oauth.insert(
        k,
        Set {
            value: g.value.trim().to_owned(),
            origin: g.origin.to_owned(),
        },
    );
    Ok(())
}

fn oauthbearer_method(_: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    if !g.value.trim().eq_ignore_ascii_case("oidc") {
        return Err(g.bad("oidc (the client credentials grant)"));
    }
    Ok(())
}

fn login_callback_handler(_: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    // Kafka's own OAuth login handler is what kafka-lock does itself; any other class is Java
    // code it cannot run.
    let class = g.value.trim();
    if !class.ends_with(".OAuthBearerLoginCallbackHandler")
        || !class.starts_with("org.apache.kafka.common.security.oauthbearer.")
    {
        return Err(g.refused(
            "Java callback handlers (such as AWS MSK IAM's) cannot be loaded; \
             kafka-lock does Kafka's OAuthBearerLoginCallbackHandler itself",
        ));
    }
    Ok(())
}

fn ssl_ca_location(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    // librdkafka's "probe" looks for the system's CA store; the bundled roots are kafka-lock's
    // equivalent, and its default.
    c.ca = if g.value.trim() == "probe" {
        None
    } else {
        g.set(pem_file(g, "a PEM file of CA certificates")?)
    };
    Ok(())
}

fn pem_file(g: &Given<'_>, expected: &str) -> Result<Pem, ConfigError> {
    Ok(Pem::File(path(g.value).ok_or_else(|| g.bad(expected))?))
}

fn pem_text(g: &Given<'_>, expected: &str) -> Result<Pem, ConfigError> {
    Ok(Pem::Inline(Secret::new(
        pem(g.value).ok_or_else(|| g.bad(expected))?,
    )))
}

fn store_type(g: &Given<'_>) -> Result<String, ConfigError> {
    let t = g.value.trim().to_ascii_uppercase();
    if !matches!(t.as_str(), "PEM" | "JKS" | "PKCS12") {
        return Err(g.bad("PEM (JKS and PKCS12 stores must be converted to PEM)"));
    }
    Ok(t)
}

fn endpoint_identification(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let on = match g.value.trim().to_ascii_lowercase().as_str() {
        "https" => true,
        "" | "none" => false,
        _ => return Err(g.bad("https (the default), or empty to turn host name checks off")),
    };
    c.verify_hostname = g.set(on);
    Ok(())
}

fn crypto_provider(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let p: TlsProvider = g.value.trim().parse().map_err(|_| {
        g.bad(&format!(
            "ring or graviola (this build has: {})",
            TlsProvider::compiled()
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))
    })?;
    c.tls_provider = g.set(p);
    Ok(())
}

/// The timing keys, kept by key in milliseconds from 1 to `i32::MAX` as Kafka's int settings.
fn timeout(c: &mut ClientConfig, g: &Given<'_>) -> Result<(), ConfigError> {
    let ms: u64 = g
        .value
        .trim()
        .parse()
        .ok()
        .filter(|&ms| (1..=i32::MAX as u64).contains(&ms))
        .ok_or_else(|| g.bad("a whole number of milliseconds from 1 to 2147483647"))?;
    c.timeouts.insert(
        g.key,
        Set {
            value: Duration::from_millis(ms),
            origin: g.origin.to_owned(),
        },
    );
    Ok(())
}

/// PEM text given as a setting's value, put back into PEM's line structure: a value continued
/// over several properties lines, or passed through `-X` or a variable, often arrives with its
/// line ends turned into spaces, which PEM readers refuse (Kafka's own reader accepts them).
fn pem(value: &str) -> Option<String> {
    let mut out = String::new();
    let mut rest = value;
    while let Some(start) = rest.find("-----BEGIN ") {
        let after = &rest[start + "-----BEGIN ".len()..];
        let label_end = after.find("-----")?;
        let label = after[..label_end].trim();
        let body_and_rest = &after[label_end + 5..];
        let end_marker = format!("-----END {label}-----");
        let end = body_and_rest.find(&end_marker)?;
        let body: String = body_and_rest[..end]
            .chars()
            .filter(|c| !c.is_whitespace())
            .collect();
        if label.is_empty() || body.is_empty() || body.contains(':') {
            // PEM headers (Proc-Type: an encrypted key) or nothing at all.
            return None;
        }
        out.push_str(&format!("-----BEGIN {label}-----\n"));
        for chunk in body.as_bytes().chunks(64) {
            out.push_str(&String::from_utf8_lossy(chunk));
            out.push('\n');
        }
        out.push_str(&end_marker);
        out.push('\n');
        rest = &body_and_rest[end + end_marker.len()..];
    }
    (!out.is_empty()).then_some(out)
}

fn path(value: &str) -> Option<PathBuf> {
    let v = value.trim();
    (!v.is_empty()).then(|| PathBuf::from(v))
}

#[cfg(test)]
mod tests;

//! SASL client messages, sans I/O: PLAIN (RFC 4616) and SCRAM (RFC 5802, with SHA-256 as in
//! RFC 7677 and SHA-512 as Kafka adds it, KIP-84). The driver carries the messages in
//! SaslAuthenticate requests; nothing here touches a socket or a clock.
//!
//! The SCRAM client checks what RFC 5802 asks a client to check: the server's nonce extends
//! ours, the salt is valid base64, the iteration count is within [`MIN_ITERATIONS`] and
//! [`MAX_ITERATIONS`] (below, the password is protected too weakly; above, one PBKDF2 run costs
//! seconds, a denial of service a hostile server could ask for), `e=` server errors are reported
//! as such, and the server's final signature proves it holds the password's verifier before
//! the exchange counts as done. Every message is parsed with bounds and typed errors, never a
//! panic (fuzzed: `fuzz/fuzz_targets/sasl_scram.rs`).
//!
//! The client proof, the salted password and the keys derived from it are wiped from memory
//! (`zeroize`) and never formatted: [`ScramClient`]'s `Debug` shows the mechanism and the state.

use std::fmt;

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine as _;
use hmac::digest::core_api::BlockSizeUser;
use hmac::digest::KeyInit;
use hmac::{Mac, SimpleHmac};
use sha2::{Digest, Sha256, Sha512};
use zeroize::Zeroizing;

/// RFC 7677's floor for the iteration count (and Apache Kafka's `ScramMechanism` minimum).
pub const MIN_ITERATIONS: u32 = 4096;

/// The largest iteration count accepted. Apache Kafka refuses to store credentials with more
/// than 16384; four times that still bounds one PBKDF2-HMAC-SHA-512 run to tens of
/// milliseconds on a current CPU.
pub const MAX_ITERATIONS: u32 = 65_536;

/// Longest server message accepted, far above the ~150 bytes a real one has.
pub const MAX_SERVER_MESSAGE: usize = 4096;

/// The SCRAM hash.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScramHash {
    /// SCRAM-SHA-256.
    Sha256,
    /// SCRAM-SHA-512.
    Sha512,
}

/// Why a SCRAM exchange cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScramError {
    /// The server's message does not parse.
    #[error("malformed server message: {0}")]
    Malformed(String),
    /// The server's nonce does not start with ours: a replay or a confused server.
    #[error("the server's nonce does not extend the client's")]
    NonceMismatch,
    /// The iteration count is outside the accepted range.
    #[error("the server asks for {0} PBKDF2 iterations; accepted are {MIN_ITERATIONS} to {MAX_ITERATIONS}")]
    Iterations(u64),
    /// The server reported an error (`e=`), e.g. `invalid-proof`.
    #[error("the server says: {0}")]
    Server(String),
    /// The server's signature is wrong: it does not know the password's verifier.
    #[error("the server's signature does not verify; it does not hold this user's credentials (is this the right broker?)")]
    BadServerSignature,
    /// A message arrived in a state that expects none.
    #[error("unexpected message in state {0}")]
    State(&'static str),
}

/// The PLAIN message: `authzid NUL authcid NUL passwd` with an empty authzid.
pub fn plain_message(username: &str, password: &str) -> Zeroizing<Vec<u8>> {
    let mut out = Zeroizing::new(Vec::with_capacity(username.len() + password.len() + 2));
    out.push(0);
    out.extend_from_slice(username.as_bytes());
    out.push(0);
    out.extend_from_slice(password.as_bytes());
    out
}

/// The server-first-message's fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerFirst {
    /// `r=`: the client nonce followed by the server's.
    pub nonce: String,
    /// `s=`, decoded.
    pub salt: Vec<u8>,
    /// `i=`.
    pub iterations: u32,
}

/// Parses a server-first-message (`r=...,s=...,i=...[,ext]`), checking the iteration bounds.
pub fn parse_server_first(msg: &[u8]) -> Result<ServerFirst, ScramError> {
    let text = text(msg)?;
    if let Some(e) = text.strip_prefix("e=") {
        return Err(ScramError::Server(printable(e)));
    }
    if text.starts_with("m=") {
        return Err(ScramError::Malformed(
            "the server requires an extension (m=) kafka-lock does not know".into(),
        ));
    }
    let mut parts = text.split(',');
    let nonce = attr(parts.next(), 'r')?;
    let salt = attr(parts.next(), 's')?;
    let iterations = attr(parts.next(), 'i')?;
    // Further attributes are extensions, which a client ignores (RFC 5802 section 5.1).
    if nonce.is_empty()
        || !nonce
            .bytes()
            .all(|b| (0x21..=0x7e).contains(&b) && b != b',')
    {
        return Err(ScramError::Malformed(
            "the nonce is empty or not printable".into(),
        ));
    }
    let salt = BASE64
        .decode(salt)
        .map_err(|e| ScramError::Malformed(format!("the salt is not base64: {e}")))?;
    if salt.is_empty() {
        return Err(ScramError::Malformed("the salt is empty".into()));
    }
    if iterations.is_empty()
        || iterations.len() > 10
        || !iterations.bytes().all(|b| b.is_ascii_digit())
    {
        return Err(ScramError::Malformed(format!(
            "the iteration count {:?} is not a number",
            printable(iterations)
        )));
    }
    let n: u64 = iterations
        .parse()
        .map_err(|_| ScramError::Malformed("the iteration count is not a number".into()))?;
    if !(u64::from(MIN_ITERATIONS)..=u64::from(MAX_ITERATIONS)).contains(&n) {
        return Err(ScramError::Iterations(n));
    }
    Ok(ServerFirst {
        nonce: nonce.to_owned(),
        salt,
        iterations: n as u32,
    })
}

/// The server-final-message: `Ok(signature)` for `v=`, the server's error for `e=`.
pub fn parse_server_final(msg: &[u8]) -> Result<Vec<u8>, ScramError> {
    let text = text(msg)?;
    if let Some(e) = text.strip_prefix("e=") {
        return Err(ScramError::Server(printable(
            e.split(',').next().unwrap_or(""),
        )));
    }
    let v = attr(text.split(',').next(), 'v')?;
    BASE64
        .decode(v)
        .map_err(|e| ScramError::Malformed(format!("the server signature is not base64: {e}")))
}

fn text(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.len() > MAX_SERVER_MESSAGE {
        return Err(ScramError::Malformed(format!(
            "{} bytes, more than the {MAX_SERVER_MESSAGE} accepted",
            msg.len()
        )));
    }
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("not UTF-8".into()))
}

fn attr(part: Option<&str>, name: char) -> Result<&str, ScramError> {
    let part = part.ok_or_else(|| ScramError::Malformed(format!("no {name}= attribute")))?;
    let mut chars = part.chars();
    if chars.next() != Some(name) || chars.next() != Some('=') {
        return Err(ScramError::Malformed(format!(
            "expected {name}= but found {:?}",
            printable(&part.chars().take(2).collect::<String>())
        )));
    }
    Ok(&part[2..])
}

/// A server's text for an error message: at most 200 printable characters.
fn printable(s: &str) -> String {
    s.chars().filter(|c| !c.is_control()).take(200).collect()
}

/// `saslname` escaping of a username (RFC 5802 section 5.1).
fn sasl_name(username: &str) -> String {
    username.replace('=', "=3D").replace(',', "=2C")
}

enum State {
    Initial,
    /// Sent client-first, waiting for server-first.
    First,
    /// Sent client-final; the expected server signature.
    Final(Zeroizing<Vec<u8>>),
    Done,
    Failed,
}

impl State {
    fn name(&self) -> &'static str {
        match self {
            State::Initial => "initial",
            State::First => "waiting for server-first",
            State::Final(_) => "waiting for server-final",
            State::Done => "done",
            State::Failed => "failed",
        }
    }
}

/// One SCRAM exchange, client side: [`client_first`](ScramClient::client_first), then
/// [`server_first`](ScramClient::server_first) gives the client-final-message (this step runs
/// PBKDF2: call it off the async runtime), then [`server_final`](ScramClient::server_final)
/// verifies the server.
pub struct ScramClient {
    hash: ScramHash,
    username: String,
    password: Zeroizing<String>,
    nonce: String,
    client_first_bare: String,
    state: State,
}

impl fmt::Debug for ScramClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScramClient")
            .field("hash", &self.hash)
            .field("state", &self.state.name())
            .finish_non_exhaustive()
    }
}

impl ScramClient {
    /// A client for `username` and `password` with the client nonce `nonce` (printable ASCII
    /// without commas; at least 16 random bytes' worth, base64 for instance).
    pub fn new(hash: ScramHash, username: &str, password: &str, nonce: String) -> Self {
        ScramClient {
            hash,
            username: username.to_owned(),
            password: Zeroizing::new(password.to_owned()),
            nonce,
            client_first_bare: String::new(),
            state: State::Initial,
        }
    }

    /// The client-first-message (`n,,n=user,r=nonce`).
    pub fn client_first(&mut self) -> Vec<u8> {
        self.client_first_bare = format!("n={},r={}", sasl_name(&self.username), self.nonce);
        self.state = State::First;
        format!("n,,{}", self.client_first_bare).into_bytes()
    }

    /// Handles the server-first-message and returns the client-final-message.
    pub fn server_first(&mut self, msg: &[u8]) -> Result<Zeroizing<Vec<u8>>, ScramError> {
        if !matches!(self.state, State::First) {
            return Err(ScramError::State(self.state.name()));
        }
        self.state = State::Failed;
        let first = parse_server_first(msg)?;
        if first.nonce.len() <= self.nonce.len() || !first.nonce.starts_with(&self.nonce) {
            return Err(ScramError::NonceMismatch);
        }
        // c= is base64("n,,"): no channel binding, no authzid.
        let without_proof = format!("c=biws,r={}", first.nonce);
        let server_first = std::str::from_utf8(msg).unwrap_or_default();
        let auth_message = Zeroizing::new(format!(
            "{},{},{}",
            self.client_first_bare, server_first, without_proof
        ));
        let (proof, server_signature) = match self.hash {
            ScramHash::Sha256 => prove::<Sha256>(
                self.password.as_bytes(),
                &first.salt,
                first.iterations,
                auth_message.as_bytes(),
            ),
            ScramHash::Sha512 => prove::<Sha512>(
                self.password.as_bytes(),
                &first.salt,
                first.iterations,
                auth_message.as_bytes(),
            ),
        };
        let mut out = Zeroizing::new(without_proof.into_bytes());
        out.extend_from_slice(b",p=");
        out.extend_from_slice(BASE64.encode(&*proof).as_bytes());
        self.state = State::Final(server_signature);
        Ok(out)
    }

    /// Verifies the server-final-message; `Ok` means both sides proved themselves.
    pub fn server_final(&mut self, msg: &[u8]) -> Result<(), ScramError> {
        let expected = match std::mem::replace(&mut self.state, State::Failed) {
            State::Final(expected) => expected,
            other => {
                let name = other.name();
                self.state = other;
                return Err(ScramError::State(name));
            }
        };
        let signature = parse_server_final(msg)?;
        // Constant time: the comparison must not tell an attacker how much of a forged
        // signature was right.
        let equal = signature.len() == expected.len()
            && signature
                .iter()
                .zip(expected.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !equal {
            return Err(ScramError::BadServerSignature);
        }
        self.state = State::Done;
        Ok(())
    }
}

/// RFC 5802 section 3: the ClientProof and the expected ServerSignature.
fn prove<D>(
    password: &[u8],
    salt: &[u8],
    iterations: u32,
    auth_message: &[u8],
) -> (Zeroizing<Vec<u8>>, Zeroizing<Vec<u8>>)
where
    D: Digest + BlockSizeUser + Clone + Sync,
{
    let mut salted = Zeroizing::new(vec![0u8; <D as Digest>::output_size()]);
    pbkdf2::pbkdf2::<SimpleHmac<D>>(password, salt, iterations, &mut salted)
        .expect("HMAC accepts keys of any length");
    let hmac = |key: &[u8], data: &[u8]| -> Zeroizing<Vec<u8>> {
        let mut mac = <SimpleHmac<D> as KeyInit>::new_from_slice(key)
            .expect("HMAC accepts keys of any length");
        mac.update(data);
        Zeroizing::new(mac.finalize().into_bytes().to_vec())
    };
    let client_key = hmac(&salted, b"Client Key");
    let stored_key = Zeroizing::new(D::digest(&*client_key).to_vec());
    let client_signature = hmac(&stored_key, auth_message);
    let proof = Zeroizing::new(
        client_key
            .iter()
            .zip(client_signature.iter())
            .map(|(k, s)| k ^ s)
            .collect::<Vec<u8>>(),
    );
    let server_key = hmac(&salted, b"Server Key");
    (proof, hmac(&server_key, auth_message))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 7677 section 3's example exchange (SCRAM-SHA-256, user "user", password "pencil").
    #[test]
    fn rfc7677_example() {
        let mut c = ScramClient::new(
            ScramHash::Sha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO".into(),
        );
        assert_eq!(c.client_first(), b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let fin = c
            .server_first(
                b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                  s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096",
            )
            .unwrap();
        assert_eq!(
            std::str::from_utf8(&fin).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        c.server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
    }

    #[test]
    fn forged_server_signature_is_refused() {
        let mut c = ScramClient::new(
            ScramHash::Sha256,
            "user",
            "pencil",
            "rOprNGfwEbeRWgbNEkqO".into(),
        );
        c.client_first();
        c.server_first(b"r=rOprNGfwEbeRWgbNEkqOxyz,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .unwrap();
        assert_eq!(
            c.server_final(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="),
            Err(ScramError::BadServerSignature)
        );
    }

    #[test]
    fn server_first_checks() {
        let mut c = ScramClient::new(ScramHash::Sha512, "u", "p", "abc".into());
        c.client_first();
        assert_eq!(
            c.server_first(b"r=xyzdef,s=AAAA,i=4096"),
            Err(ScramError::NonceMismatch)
        );
        assert_eq!(
            parse_server_first(b"r=abcdef,s=AAAA,i=1"),
            Err(ScramError::Iterations(1))
        );
        assert_eq!(
            parse_server_first(b"r=abcdef,s=AAAA,i=99999999999"),
            Err(ScramError::Malformed(
                "the iteration count \"99999999999\" is not a number".into()
            ))
        );
        assert!(matches!(
            parse_server_first(b"r=abcdef,s=!!,i=4096"),
            Err(ScramError::Malformed(_))
        ));
        assert_eq!(
            parse_server_first(b"e=unknown-user"),
            Err(ScramError::Server("unknown-user".into()))
        );
        assert_eq!(
            parse_server_final(b"e=invalid-proof"),
            Err(ScramError::Server("invalid-proof".into()))
        );
        assert!(matches!(
            parse_server_first(b""),
            Err(ScramError::Malformed(_))
        ));
        assert!(matches!(
            parse_server_first(&[0xff; 3]),
            Err(ScramError::Malformed(_))
        ));
    }

    #[test]
    fn names_are_escaped_and_nothing_secret_is_printed() {
        let mut c = ScramClient::new(ScramHash::Sha256, "a=b,c", "hunter2", "n0nce".into());
        assert_eq!(c.client_first(), b"n,,n=a=3Db=2Cc,r=n0nce");
        assert!(!format!("{c:?}").contains("hunter2"));
        assert_eq!(&*plain_message("u", "p"), b"\0u\0p");
    }
}

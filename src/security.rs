//! Connecting to secured clusters: TLS and SASL settings in Kafka's own vocabulary, and the
//! errors a misconfigured or refused connection reports.
//!
//! A [`Security`] is built from a [`SecurityProtocol`] (Kafka's `security.protocol`), plus [`Tls`]
//! settings for `SSL` / `SASL_SSL` and [`Sasl`] credentials for `SASL_PLAINTEXT` / `SASL_SSL`,
//! and handed to [`crate::LockOptions::security`] (or [`crate::driver::ConnConfig::with_security`]).
//! Every connection kafka-lock opens (bootstrap, coordinator, ledger partition leader) then
//! performs the TLS handshake and the SASL exchange before its first other request.
//!
//! ```
//! use kafka_lock::{Sasl, Secret, Security, SecurityProtocol, Tls};
//! let security = Security::new(SecurityProtocol::SaslSsl)
//!     .with_tls(Tls::new().ca_file("/etc/kafka/ca.pem"))
//!     .with_sasl(Sasl::scram_sha512("locker", Secret::new("s3cret")));
//! assert!(!format!("{security:?}").contains("s3cret"));
//! ```
//!
//! | Kafka setting | here |
//! |---|---|
//! | `security.protocol` | [`SecurityProtocol`] (parses `PLAINTEXT`, `SSL`, `SASL_PLAINTEXT`, `SASL_SSL`) |
//! | `sasl.mechanism` | [`SaslMechanism`] (parses `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`); `OAUTHBEARER`: `Sasl::oauthbearer` (feature `oauth`) |
//! | `sasl.username` / `sasl.password` | [`Sasl::new`] |
//! | `ssl.ca.location` | [`Tls::ca_file`] (else the bundled Mozilla roots: [`Tls::new`]) |
//! | `ssl.certificate.location` / `ssl.key.location` | [`Tls::client_cert_files`] (mTLS) |
//! | `ssl.endpoint.identification.algorithm=` (empty) | [`Tls::dangerous_disable_hostname_verification`] |
//! | `ssl.crypto.provider` (kafka-lock's own) | [`Tls::crypto_provider`] |
//!
//! TLS needs the `tls` cargo feature (the `ring` crypto provider; on with `cli`) or
//! `tls-graviola` (the pure-Rust `graviola` provider, see [`TlsProvider`]); without either, a
//! [`Security`] that asks for TLS is refused by [`Security::validate`] with a message saying so.
//! SASL needs no feature.
//!
//! OAUTHBEARER with the OAuth client credentials grant is built in (feature `oauth`,
//! `crate::OAuthBearer`). Other token mechanisms (AWS MSK IAM, or OAUTHBEARER with tokens from
//! elsewhere) plug in through [`SaslTokenProvider`]: the driver sends the provider's message as
//! the one SaslAuthenticate of a connection.

use std::fmt;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::str::FromStr;
use std::sync::Arc;

use zeroize::Zeroizing;

#[cfg(feature = "tls-graviola")]
mod cpu;
#[cfg(any(feature = "tls", feature = "tls-graviola"))]
mod provider;
#[cfg(any(feature = "tls", feature = "tls-graviola"))]
pub(crate) use provider::crypto_provider;

/// Kafka's `security.protocol`: whether connections use TLS and whether they authenticate with
/// SASL.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SecurityProtocol {
    /// No TLS, no SASL (the default).
    #[default]
    Plaintext,
    /// TLS; the client is authenticated by its certificate if the broker asks for one (mTLS).
    Ssl,
    /// SASL authentication over an unencrypted connection.
    SaslPlaintext,
    /// SASL authentication inside TLS.
    SaslSsl,
}

impl SecurityProtocol {
    /// Kafka's name for it, e.g. `SASL_SSL`.
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "PLAINTEXT",
            SecurityProtocol::Ssl => "SSL",
            SecurityProtocol::SaslPlaintext => "SASL_PLAINTEXT",
            SecurityProtocol::SaslSsl => "SASL_SSL",
        }
    }

    /// Whether connections are wrapped in TLS.
    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    /// Whether connections authenticate with SASL.
    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

impl fmt::Display for SecurityProtocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SecurityProtocol {
    type Err = crate::Error;

    /// Kafka's names, case-insensitively (the Java client upper-cases them too).
    fn from_str(s: &str) -> crate::Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAINTEXT" => Ok(SecurityProtocol::Plaintext),
            "SSL" => Ok(SecurityProtocol::Ssl),
            "SASL_PLAINTEXT" => Ok(SecurityProtocol::SaslPlaintext),
            "SASL_SSL" => Ok(SecurityProtocol::SaslSsl),
            _ => Err(crate::Error::Config(format!(
                "security.protocol {s:?} is not one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"
            ))),
        }
    }
}

/// A password or key: its `Debug` and `Display` print `***`, and its memory is wiped when it is
/// dropped.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Zeroizing<String>);

impl Secret {
    /// Wraps `value`.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(Zeroizing::new(value.into()))
    }

    /// The secret itself; call it only where it is used.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

impl fmt::Display for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

impl From<String> for Secret {
    fn from(s: String) -> Self {
        Secret::new(s)
    }
}

impl From<&str> for Secret {
    fn from(s: &str) -> Self {
        Secret::new(s)
    }
}

/// PEM data given either as a file to read at connect time or in memory.
#[derive(Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Pem {
    /// A file holding PEM text.
    File(PathBuf),
    /// PEM text in memory (e.g. from an environment variable).
    Inline(Secret),
}

impl fmt::Debug for Pem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Pem::File(p) => f.debug_tuple("File").field(p).finish(),
            // Certificates are public but keys are not; inline PEM is never printed.
            Pem::Inline(_) => f.write_str("Inline(***)"),
        }
    }
}

/// The crypto library under TLS (a rustls crypto provider). Which exist depends on the cargo
/// features: `tls` brings [`TlsProvider::Ring`], `tls-graviola` brings [`TlsProvider::Graviola`].
/// Both offer the same cipher suites, key exchanges and signature algorithms to the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum TlsProvider {
    /// `ring` (feature `tls`): C and assembly built with a C compiler; long proven.
    Ring,
    /// `graviola` (feature `tls-graviola`): pure Rust, no C compiler for any target; x86_64
    /// and aarch64 CPUs with the extensions it needs (x86_64: aes, pclmulqdq, ssse3, avx, avx2,
    /// bmi1, bmi2, adx; aarch64: neon, aes, pmull, sha2), checked before any TLS.
    Graviola,
}

impl TlsProvider {
    /// The providers this build has, its default first: graviola when `tls-graviola` is on
    /// (enabling it is the deliberate choice; `tls` often comes with `cli`), else ring.
    pub fn compiled() -> &'static [TlsProvider] {
        &[
            #[cfg(feature = "tls-graviola")]
            TlsProvider::Graviola,
            #[cfg(feature = "tls")]
            TlsProvider::Ring,
        ]
    }

    /// The provider used when [`Tls::crypto_provider`] is not set; `None` in a build without
    /// TLS.
    pub fn build_default() -> Option<TlsProvider> {
        Self::compiled().first().copied()
    }

    /// Its name: `ring` or `graviola`.
    pub fn as_str(self) -> &'static str {
        match self {
            TlsProvider::Ring => "ring",
            TlsProvider::Graviola => "graviola",
        }
    }

    /// The cargo feature that brings it.
    pub fn feature(self) -> &'static str {
        match self {
            TlsProvider::Ring => "tls",
            TlsProvider::Graviola => "tls-graviola",
        }
    }

    /// Whether this build has it and this machine can run it; the error says what is missing.
    pub fn check(self) -> crate::Result<()> {
        if !Self::compiled().contains(&self) {
            return Err(crate::Error::Config(format!(
                "this build of kafka-lock has no TLS provider {self} (the `{}` cargo feature){}",
                self.feature(),
                match Self::compiled() {
                    [] => String::new(),
                    have => format!(
                        "; it has {}",
                        have.iter()
                            .map(|p| p.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                }
            )));
        }
        #[cfg(feature = "tls-graviola")]
        if self == TlsProvider::Graviola {
            cpu::check().map_err(crate::Error::Security)?;
        }
        Ok(())
    }
}

impl fmt::Display for TlsProvider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for TlsProvider {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        match s.to_ascii_lowercase().as_str() {
            "ring" => Ok(TlsProvider::Ring),
            "graviola" => Ok(TlsProvider::Graviola),
            _ => Err(crate::Error::Config(format!(
                "unknown TLS provider {s:?}; expected ring or graviola"
            ))),
        }
    }
}

/// TLS settings (`ssl.*`).
///
/// Defaults: the server's certificate is verified against the bundled Mozilla roots
/// (`webpki-roots`, so a `FROM scratch` image needs no CA store), its name against the host
/// of the address dialled (DNS names as DNS SANs, IP addresses as IP SANs), no client
/// certificate. TLS 1.2 and 1.3, with the build's default [`TlsProvider`].
#[derive(Clone, PartialEq, Eq, Debug, Default)]
#[non_exhaustive]
pub struct Tls {
    /// The CA certificates to trust instead of the bundled roots (`ssl.ca.location`).
    pub ca: Option<Pem>,
    /// The client's certificate chain and private key, for brokers that require client
    /// authentication (`ssl.certificate.location`, `ssl.key.location`).
    pub client_cert: Option<(Pem, Pem)>,
    /// Whether the certificate must name the host dialled (default true). Turning it off lets
    /// any certificate signed by a trusted CA impersonate any broker; kafka-lock logs a warning
    /// on every connection made without it.
    pub verify_hostname: bool,
    /// The crypto provider; `None` is [`TlsProvider::build_default`].
    pub provider: Option<TlsProvider>,
}

impl Tls {
    /// Verification against the bundled roots, hostname verification on, no client certificate.
    pub fn new() -> Self {
        Tls {
            ca: None,
            client_cert: None,
            verify_hostname: true,
            provider: None,
        }
    }

    /// Uses this crypto provider instead of the build's default (a build with both `tls` and
    /// `tls-graviola` has both).
    pub fn crypto_provider(mut self, provider: TlsProvider) -> Self {
        self.provider = Some(provider);
        self
    }

    /// The provider connections use: the one set, else the build's default.
    pub fn effective_provider(&self) -> Option<TlsProvider> {
        self.provider.or_else(TlsProvider::build_default)
    }

    /// Trusts the CA certificates in this PEM file (one or more) instead of the bundled roots.
    pub fn ca_file(mut self, path: impl Into<PathBuf>) -> Self {
        self.ca = Some(Pem::File(path.into()));
        self
    }

    /// Trusts these PEM CA certificates instead of the bundled roots.
    pub fn ca_pem(mut self, pem: impl Into<String>) -> Self {
        self.ca = Some(Pem::Inline(Secret::new(pem)));
        self
    }

    /// Presents this certificate chain (PEM, leaf first) and private key (PEM: PKCS#8, PKCS#1 or
    /// SEC1) to brokers that ask for one.
    pub fn client_cert_files(mut self, cert: impl Into<PathBuf>, key: impl Into<PathBuf>) -> Self {
        self.client_cert = Some((Pem::File(cert.into()), Pem::File(key.into())));
        self
    }

    /// [`Tls::client_cert_files`] with the PEM text in memory.
    pub fn client_cert_pem(mut self, cert: impl Into<String>, key: Secret) -> Self {
        self.client_cert = Some((Pem::Inline(Secret::new(cert)), Pem::Inline(key)));
        self
    }

    /// Accepts a certificate signed by a trusted CA whatever host it names (Kafka's
    /// `ssl.endpoint.identification.algorithm=` set empty). The chain is still verified.
    /// Anyone holding any certificate from that CA can then pose as the broker.
    pub fn dangerous_disable_hostname_verification(mut self) -> Self {
        self.verify_hostname = false;
        self
    }
}

/// A SASL mechanism with a username and password (`sasl.mechanism`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum SaslMechanism {
    /// `PLAIN` (RFC 4616): the password travels to the broker; use it only inside TLS.
    Plain,
    /// `SCRAM-SHA-256` (RFC 5802, RFC 7677).
    ScramSha256,
    /// `SCRAM-SHA-512` (RFC 5802 with SHA-512, as Kafka defines it).
    ScramSha512,
}

impl SaslMechanism {
    /// The name sent in SaslHandshake, e.g. `SCRAM-SHA-512`.
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

impl fmt::Display for SaslMechanism {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SaslMechanism {
    type Err = crate::Error;

    /// `PLAIN`, `SCRAM-SHA-256`, `SCRAM-SHA-512`, case-insensitively.
    fn from_str(s: &str) -> crate::Result<Self> {
        match s.trim().to_ascii_uppercase().as_str() {
            "PLAIN" => Ok(SaslMechanism::Plain),
            "SCRAM-SHA-256" => Ok(SaslMechanism::ScramSha256),
            "SCRAM-SHA-512" => Ok(SaslMechanism::ScramSha512),
            "OAUTHBEARER" | "AWS_MSK_IAM" | "GSSAPI" => Err(crate::Error::Config(format!(
                "sasl.mechanism {s} takes no username and password; PLAIN, SCRAM-SHA-256 and \
                 SCRAM-SHA-512 do (OAUTHBEARER: Sasl::oauthbearer with the `oauth` feature; \
                 other token mechanisms plug in with Sasl::token)"
            ))),
            _ => Err(crate::Error::Config(format!(
                "sasl.mechanism {s:?} is not one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"
            ))),
        }
    }
}

/// The future a [`SaslTokenProvider`] returns.
pub type TokenFuture<'a> = Pin<Box<dyn Future<Output = Result<Secret, String>> + Send + 'a>>;

/// A SASL mechanism whose client speaks once: OAUTHBEARER (RFC 7628, KIP-255), AWS MSK IAM and
/// the like. kafka-lock asks for a fresh message for every connection and every
/// re-authentication (KIP-368), sends it as the only SaslAuthenticate, and treats the broker's
/// answer as the end of the exchange.
///
/// The hook for token sources kafka-lock does not build in (AWS request signing, tokens from a
/// file or another library); the client credentials grant is built in (`Sasl::oauthbearer`,
/// feature `oauth`). For `OAUTHBEARER`, a token the broker refuses is reported with the broker's
/// RFC 7628 error.
pub trait SaslTokenProvider: Send + Sync + fmt::Debug + 'static {
    /// The mechanism name sent in SaslHandshake, e.g. `OAUTHBEARER`.
    fn mechanism(&self) -> &str;

    /// The client's message for a connection to `broker` (`host:port`); for OAUTHBEARER, the
    /// RFC 7628 initial client response (`n,,\x01auth=Bearer <token>\x01\x01`). An error is
    /// reported as an authentication failure carrying its text, so it must not contain secrets.
    fn initial_response<'a>(&'a self, broker: &'a str) -> TokenFuture<'a>;
}

/// SASL credentials (`sasl.mechanism`, `sasl.username`, `sasl.password`).
#[derive(Clone, Debug)]
pub struct Sasl(pub(crate) SaslKind);

#[derive(Clone, Debug)]
pub(crate) enum SaslKind {
    Password {
        mechanism: SaslMechanism,
        username: String,
        password: Secret,
    },
    Token(Arc<dyn SaslTokenProvider>),
    #[cfg(feature = "oauth")]
    OAuth(Arc<crate::oauth::OAuthBearer>),
}

impl PartialEq for Sasl {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (
                SaslKind::Password {
                    mechanism: m1,
                    username: u1,
                    password: p1,
                },
                SaslKind::Password {
                    mechanism: m2,
                    username: u2,
                    password: p2,
                },
            ) => m1 == m2 && u1 == u2 && p1 == p2,
            (SaslKind::Token(a), SaslKind::Token(b)) => Arc::ptr_eq(a, b),
            #[cfg(feature = "oauth")]
            (SaslKind::OAuth(a), SaslKind::OAuth(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Sasl {}

impl Sasl {
    /// `mechanism` with `username` and `password`.
    pub fn new(mechanism: SaslMechanism, username: impl Into<String>, password: Secret) -> Self {
        Sasl(SaslKind::Password {
            mechanism,
            username: username.into(),
            password,
        })
    }

    /// `PLAIN`.
    pub fn plain(username: impl Into<String>, password: Secret) -> Self {
        Sasl::new(SaslMechanism::Plain, username, password)
    }

    /// `SCRAM-SHA-256`.
    pub fn scram_sha256(username: impl Into<String>, password: Secret) -> Self {
        Sasl::new(SaslMechanism::ScramSha256, username, password)
    }

    /// `SCRAM-SHA-512`.
    pub fn scram_sha512(username: impl Into<String>, password: Secret) -> Self {
        Sasl::new(SaslMechanism::ScramSha512, username, password)
    }

    /// A token mechanism (see [`SaslTokenProvider`]).
    pub fn token(provider: Arc<dyn SaslTokenProvider>) -> Self {
        Sasl(SaslKind::Token(provider))
    }

    /// `OAUTHBEARER` with tokens from an OAuth 2 token endpoint (feature `oauth`).
    #[cfg(feature = "oauth")]
    pub fn oauthbearer(oauth: crate::oauth::OAuthBearer) -> Self {
        Sasl(SaslKind::OAuth(Arc::new(oauth)))
    }

    /// The mechanism's name as sent in SaslHandshake.
    pub fn mechanism_name(&self) -> &str {
        match &self.0 {
            SaslKind::Password { mechanism, .. } => mechanism.as_str(),
            SaslKind::Token(p) => p.mechanism(),
            #[cfg(feature = "oauth")]
            SaslKind::OAuth(_) => "OAUTHBEARER",
        }
    }

    /// The username, for password mechanisms.
    pub fn username(&self) -> Option<&str> {
        match &self.0 {
            SaslKind::Password { username, .. } => Some(username),
            _ => None,
        }
    }
}

/// How connections are secured: `security.protocol` with its TLS and SASL settings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Security {
    /// `security.protocol`.
    pub protocol: SecurityProtocol,
    /// Used when `protocol` is `SSL` or `SASL_SSL`; [`Tls::new`] when not set.
    pub tls: Option<Tls>,
    /// Required when `protocol` is `SASL_PLAINTEXT` or `SASL_SSL`.
    pub sasl: Option<Sasl>,
}

impl Security {
    /// `protocol` with no TLS or SASL settings yet.
    pub fn new(protocol: SecurityProtocol) -> Self {
        Security {
            protocol,
            tls: None,
            sasl: None,
        }
    }

    /// Plain TCP, no authentication (the default).
    pub fn plaintext() -> Self {
        Security::default()
    }

    /// Sets the TLS settings.
    pub fn with_tls(mut self, tls: Tls) -> Self {
        self.tls = Some(tls);
        self
    }

    /// Sets the SASL credentials.
    pub fn with_sasl(mut self, sasl: Sasl) -> Self {
        self.sasl = Some(sasl);
        self
    }

    /// Checks that the settings fit together and that this build can honour them: SASL
    /// protocols need credentials, TLS protocols need a TLS provider this build has and this
    /// CPU can run ([`TlsProvider::check`]). TLS or SASL settings
    /// the protocol does not use are ignored (as Kafka's clients do).
    pub fn validate(&self) -> crate::Result<()> {
        if self.protocol.uses_sasl() && self.sasl.is_none() {
            return Err(crate::Error::Config(format!(
                "security.protocol={} needs SASL credentials (sasl.mechanism, sasl.username, \
                 sasl.password)",
                self.protocol
            )));
        }
        if let Some(Sasl(SaslKind::Password { username, .. })) = &self.sasl {
            if username.is_empty() {
                return Err(crate::Error::Config("sasl.username is empty".into()));
            }
        }
        if self.protocol.uses_tls() {
            let provider = match &self.tls {
                Some(tls) => tls.effective_provider(),
                None => TlsProvider::build_default(),
            };
            let Some(provider) = provider else {
                return Err(crate::Error::Config(format!(
                    "security.protocol={} needs TLS, and this build of kafka-lock has no TLS \
                     (the `tls` or `tls-graviola` cargo feature)",
                    self.protocol
                )));
            };
            provider.check()?;
        }
        Ok(())
    }
}

/// Which kind of refusal an error is: the CLI exits 77 (EX_NOPERM) for both.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// The broker did not accept who we are: wrong password, unknown user, mechanism not
    /// enabled, client certificate refused.
    Authentication,
    /// The broker knows who we are and refuses the operation (an ACL).
    Authorization,
}

/// Why a secured connection could not be set up; each says what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SecurityError {
    /// A plaintext connection reached a TLS listener.
    #[error(
        "the broker at {broker} looks like a TLS listener; set security.protocol=SSL or SASL_SSL"
    )]
    TlsListener {
        /// `host:port`.
        broker: String,
    },
    /// A TLS connection reached a listener that does not speak TLS.
    #[error("the broker at {broker} did not answer the TLS handshake with TLS ({detail}); it looks like a plaintext listener: set security.protocol=PLAINTEXT or SASL_PLAINTEXT, or use the TLS listener's port")]
    PlaintextListener {
        /// `host:port`.
        broker: String,
        /// What came back instead.
        detail: String,
    },
    /// The broker's certificate is not signed by a trusted CA.
    #[error("the certificate of {broker} is not signed by a trusted CA ({detail}); set ssl.ca.location to the CA certificate that signed it")]
    UnknownCa {
        /// `host:port`.
        broker: String,
        /// rustls's reason.
        detail: String,
    },
    /// The broker's certificate does not name the host dialled.
    #[error("the certificate of {broker} is not valid for {host} ({detail}); connect with a name or address the certificate holds")]
    HostnameMismatch {
        /// `host:port`.
        broker: String,
        /// The host checked.
        host: String,
        /// rustls's reason, with the names the certificate holds.
        detail: String,
    },
    /// Any other TLS failure (expired certificate, refused client certificate, protocol alert).
    #[error("TLS with {broker} failed: {detail}")]
    Tls {
        /// `host:port`.
        broker: String,
        /// What failed.
        detail: String,
    },
    /// The TLS crypto provider cannot run on this CPU: it lacks an extension the provider's
    /// routines are written for. Checked before any TLS, so nothing crashes.
    #[error("this {arch} CPU lacks {} which the TLS provider {provider} needs; run a kafka-lock built with the ring provider (cargo feature `tls`) on this machine", .missing.join(", "))]
    UnsupportedCpu {
        /// The provider that cannot run.
        provider: TlsProvider,
        /// The CPU architecture (`x86_64`, `aarch64`).
        arch: String,
        /// The CPU features it lacks (in `is_x86_feature_detected!`'s names).
        missing: Vec<String>,
    },
    /// TLS settings that cannot be used (unreadable or empty PEM, key that does not parse).
    #[error("TLS settings: {0}")]
    TlsConfig(String),
    /// The broker rejected the credentials (SASL_AUTHENTICATION_FAILED, 58).
    #[error("SASL {mechanism} authentication as {user:?} failed at {broker}: {message}; check sasl.username and sasl.password")]
    AuthenticationFailed {
        /// `host:port`.
        broker: String,
        /// The mechanism.
        mechanism: String,
        /// The username (empty for token mechanisms).
        user: String,
        /// The broker's message.
        message: String,
    },
    /// The broker's listener does not enable the mechanism (UNSUPPORTED_SASL_MECHANISM, 33).
    #[error("the broker at {broker} does not enable SASL mechanism {mechanism} on this listener; it enables: {}; set sasl.mechanism to one of them", if .enabled.is_empty() { "none".to_owned() } else { .enabled.join(", ") })]
    MechanismNotEnabled {
        /// `host:port`.
        broker: String,
        /// The mechanism asked for.
        mechanism: String,
        /// What the broker listed in its SaslHandshake response.
        enabled: Vec<String>,
    },
    /// The SASL exchange broke the protocol: a malformed server message, a wrong nonce, an
    /// absurd iteration count, or a server signature that does not verify (the server could
    /// not prove it knows the password).
    #[error("SASL {mechanism} exchange with {broker} failed: {detail}")]
    SaslProtocol {
        /// `host:port`.
        broker: String,
        /// The mechanism.
        mechanism: String,
        /// What was wrong.
        detail: String,
    },
    /// The OAuth token endpoint could not be reached, or answered something that is not a
    /// token (feature `oauth`). The CLI exits 69, as for a cluster it cannot reach.
    #[error("the OAuth token endpoint {endpoint} gave no token: {detail}")]
    TokenEndpoint {
        /// `sasl.oauthbearer.token.endpoint.url`.
        endpoint: String,
        /// What went wrong (never the client secret or a token).
        detail: String,
    },
    /// The OAuth token endpoint refused the client credentials (HTTP 400, 401 or 403). An
    /// authentication failure: the CLI exits 77.
    #[error("the OAuth token endpoint {endpoint} refused the client credentials (HTTP {status}: {reason}); check clientId, clientSecret and scope")]
    TokenRefused {
        /// `sasl.oauthbearer.token.endpoint.url`.
        endpoint: String,
        /// The HTTP status.
        status: u16,
        /// The OAuth `error` and `error_description` it gave.
        reason: String,
    },
    /// The principal may not use the lock's group (GROUP_AUTHORIZATION_FAILED, 30).
    #[error("not authorized for group {group:?}: grant the principal Read on the group (and Describe for status)")]
    GroupAuthorizationFailed {
        /// The group (the lock's name).
        group: String,
    },
    /// The principal may not use a topic (TOPIC_AUTHORIZATION_FAILED, 29).
    #[error("not authorized for topic {topic:?}: grant the principal Describe on it (Read and Write for a ledger topic)")]
    TopicAuthorizationFailed {
        /// The topic.
        topic: String,
    },
}

impl SecurityError {
    /// Whether this is an authentication or an authorization failure; `None` for TLS setup and
    /// listener mix-ups, which are configuration errors.
    pub fn auth_failure(&self) -> Option<AuthFailure> {
        match self {
            SecurityError::AuthenticationFailed { .. }
            | SecurityError::MechanismNotEnabled { .. }
            | SecurityError::TokenRefused { .. } => Some(AuthFailure::Authentication),
            SecurityError::GroupAuthorizationFailed { .. }
            | SecurityError::TopicAuthorizationFailed { .. } => Some(AuthFailure::Authorization),
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kafka_names() {
        assert_eq!(
            "sasl_ssl".parse::<SecurityProtocol>().unwrap(),
            SecurityProtocol::SaslSsl
        );
        assert_eq!(
            "SCRAM-SHA-512".parse::<SaslMechanism>().unwrap(),
            SaslMechanism::ScramSha512
        );
        assert!("TLS".parse::<SecurityProtocol>().is_err());
        assert!("OAUTHBEARER".parse::<SaslMechanism>().is_err());
    }

    #[test]
    fn secrets_are_not_printed() {
        let s = Security::new(SecurityProtocol::SaslSsl)
            .with_tls(Tls::new().client_cert_pem("CERT", Secret::new("KEYDATA")))
            .with_sasl(Sasl::plain("u", Secret::new("hunter2")));
        let dbg = format!("{s:?}");
        assert!(
            !dbg.contains("hunter2") && !dbg.contains("KEYDATA"),
            "{dbg}"
        );
    }

    #[test]
    fn sasl_protocols_need_credentials() {
        assert!(Security::new(SecurityProtocol::SaslPlaintext)
            .validate()
            .is_err());
        assert!(Security::new(SecurityProtocol::SaslPlaintext)
            .with_sasl(Sasl::plain("u", "p".into()))
            .validate()
            .is_ok());
    }
}

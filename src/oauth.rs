//! SASL/OAUTHBEARER with tokens from an OAuth 2 token endpoint (the client credentials grant,
//! RFC 6749 section 4.4), as Kafka's `OAuthBearerLoginModule` gets them with KIP-768's settings
//! (`sasl.oauthbearer.token.endpoint.url`, `clientId`, `clientSecret` and `scope` in
//! `sasl.jaas.config`).
//!
//! A token is fetched when a connection first needs one, kept, and fetched anew once 80 % of its
//! lifetime (from its `exp` claim) has passed, as Kafka's login refresh does by default
//! (`sasl.login.refresh.window.factor` = 0.8). A connection re-authenticates (KIP-368) at 85 to 95
//! % of the session lifetime the broker grants, which the broker caps at the token's expiry, so
//! every re-authentication finds the kept token stale and sends a fresh one.
//!
//! Like Kafka's client (`ClientJwtValidator`), kafka-lock reads the token's claims without
//! checking its signature (that is the broker's job): it must be a JWT with `exp` and a subject
//! claim (`sasl.oauthbearer.sub.claim.name`, `sub` by default).
//!
//! The token endpoint is reached over HTTPS only (the client secret travels in the request), with
//! ureq on rustls and the build's TLS provider; its certificate is checked against the bundled
//! Mozilla roots or the CA certificates of `https.ca.location` (librdkafka's name). Proxies named
//! in the environment are not used, as Kafka's Java client does not use them.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use base64::Engine as _;
use tokio::sync::Mutex;

use crate::security::{Pem, Secret, SecurityError, TlsProvider};

/// How long one token request may take, connection included.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The share of a token's lifetime after which it is fetched anew (Kafka's
/// `sasl.login.refresh.window.factor` default).
const REFRESH_FACTOR: f64 = 0.8;
/// The most of a token endpoint's answer read: tokens are a few KiB.
const MAX_ANSWER: u64 = 256 * 1024;

/// OAUTHBEARER settings: where tokens come from and what the client sends with them. Build one
/// with [`OAuthBearer::client_credentials`] and hand it to [`crate::security::Sasl::oauthbearer`].
///
/// ```
/// use kafka_lock::OAuthBearer;
/// use kafka_lock::Secret;
/// let oauth = OAuthBearer::client_credentials(
///     "https://idp.example.com/oauth2/token",
///     "locker",
///     Secret::new("s3cret"),
/// )
/// .unwrap()
/// .scope("kafka");
/// assert!(!format!("{oauth:?}").contains("s3cret"));
/// ```
pub struct OAuthBearer {
    endpoint: String,
    client_id: String,
    client_secret: Secret,
    scope: Option<String>,
    sub_claim: String,
    scope_claim: String,
    ca: Option<Pem>,
    provider: Option<TlsProvider>,
    extensions: Vec<(String, String)>,
    cache: Mutex<Option<Cached>>,
}

struct Cached {
    token: Secret,
    stale_at: Instant,
}

impl fmt::Debug for OAuthBearer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OAuthBearer")
            .field("endpoint", &self.endpoint)
            .field("client_id", &self.client_id)
            .field("client_secret", &self.client_secret)
            .field("scope", &self.scope)
            .field("sub_claim", &self.sub_claim)
            .field("ca", &self.ca)
            .field("provider", &self.provider)
            .field(
                "extensions",
                &self.extensions.iter().map(|(k, _)| k).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl OAuthBearer {
    /// Tokens from `endpoint` (an `https://` URL) with the client credentials grant: HTTP Basic
    /// authentication with `client_id` and `client_secret`, as Kafka's
    /// `ClientCredentialsRequestFormatter` sends them.
    pub fn client_credentials(
        endpoint: impl Into<String>,
        client_id: impl Into<String>,
        client_secret: Secret,
    ) -> crate::Result<Self> {
        let endpoint = endpoint.into();
        let client_id = client_id.into();
        let lower = endpoint.trim().to_ascii_lowercase();
        if !lower.starts_with("https://") || lower.len() <= "https://".len() {
            return Err(crate::Error::Config(format!(
                "sasl.oauthbearer.token.endpoint.url {endpoint:?} is not an https:// URL; the \
                 client secret is only sent over HTTPS"
            )));
        }
        if client_id.is_empty() || client_secret.expose().is_empty() {
            return Err(crate::Error::Config(
                "the OAuth client id and client secret (clientId, clientSecret) must not be empty"
                    .into(),
            ));
        }
        Ok(OAuthBearer {
            endpoint: endpoint.trim().to_owned(),
            client_id,
            client_secret,
            scope: None,
            sub_claim: "sub".into(),
            scope_claim: "scope".into(),
            ca: None,
            provider: None,
            extensions: Vec::new(),
            cache: Mutex::new(None),
        })
    }

    /// The scope to ask for (`scope` in `sasl.jaas.config`, `sasl.oauthbearer.scope`).
    pub fn scope(mut self, scope: impl Into<String>) -> Self {
        self.scope = Some(scope.into()).filter(|s| !s.trim().is_empty());
        self
    }

    /// The claim that names the principal (`sasl.oauthbearer.sub.claim.name`, default `sub`):
    /// a token without it is refused before it is sent.
    pub fn sub_claim(mut self, name: impl Into<String>) -> Self {
        self.sub_claim = name.into();
        self
    }

    /// The claim that holds the scope (`sasl.oauthbearer.scope.claim.name`, default `scope`);
    /// only logged, as Kafka's client only reads it.
    pub fn scope_claim(mut self, name: impl Into<String>) -> Self {
        self.scope_claim = name.into();
        self
    }

    /// Trusts these CA certificates for the token endpoint instead of the bundled roots.
    pub fn ca(mut self, ca: Pem) -> Self {
        self.ca = Some(ca);
        self
    }

    /// The TLS provider for the token endpoint (the build's default when not set).
    pub fn crypto_provider(mut self, provider: TlsProvider) -> Self {
        self.provider = Some(provider);
        self
    }

    /// A SASL extension sent with the token (`extension_<name>=<value>` in `sasl.jaas.config`,
    /// e.g. Confluent Cloud's `logicalCluster` and `identityPoolId`). Names are letters only and
    /// `auth` is reserved, as RFC 7628 and Kafka's `SaslExtensions` define them.
    pub fn extension(mut self, name: &str, value: &str) -> crate::Result<Self> {
        let name_ok =
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic()) && name != "auth";
        if !name_ok {
            return Err(crate::Error::Config(format!(
                "SASL extension name {name:?} must be letters only and not \"auth\""
            )));
        }
        let value_ok = !value.is_empty()
            && value
                .chars()
                .all(|c| matches!(c, '\x21'..='\x7e' | ' ' | '\t' | '\r' | '\n'));
        if !value_ok {
            return Err(crate::Error::Config(format!(
                "the value of SASL extension {name:?} must be printable ASCII"
            )));
        }
        self.extensions.retain(|(k, _)| k != name);
        self.extensions.push((name.to_owned(), value.to_owned()));
        Ok(self)
    }

    /// The token endpoint's URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The RFC 7628 initial client response with a token that is not stale, fetching one if
    /// needed.
    pub(crate) async fn initial_response(&self) -> Result<Secret, SecurityError> {
        let token = self.token().await?;
        let mut msg = format!("n,,\x01auth=Bearer {}", token.expose());
        for (k, v) in &self.extensions {
            msg.push('\x01');
            msg.push_str(k);
            msg.push('=');
            msg.push_str(v);
        }
        msg.push_str("\x01\x01");
        Ok(Secret::new(msg))
    }

    async fn token(&self) -> Result<Secret, SecurityError> {
        // Held across the fetch: connections opened together share one request.
        let mut cache = self.cache.lock().await;
        if let Some(c) = cache.as_ref().filter(|c| Instant::now() < c.stale_at) {
            return Ok(c.token.clone());
        }
        let fetched = self.fetch().await?;
        let token = fetched.token.clone();
        *cache = Some(fetched);
        Ok(token)
    }

    async fn fetch(&self) -> Result<Cached, SecurityError> {
        let request = Request {
            endpoint: self.endpoint.clone(),
            client_id: self.client_id.clone(),
            client_secret: self.client_secret.clone(),
            scope: self.scope.clone(),
            ca: self.ca.clone(),
            provider: self.provider,
        };
        let endpoint = self.endpoint.clone();
        // ureq blocks: off the runtime, so a holder's heartbeats are not delayed.
        let answer = tokio::task::spawn_blocking(move || request.send())
            .await
            .map_err(|e| SecurityError::TokenEndpoint {
                endpoint,
                detail: format!("the token request did not finish: {e}"),
            })??;
        let claims =
            claims(&answer, &self.sub_claim).map_err(|detail| SecurityError::TokenEndpoint {
                endpoint: self.endpoint.clone(),
                detail,
            })?;
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs_f64();
        let left = claims.exp - now;
        if left <= 0.0 {
            tracing::warn!(
                endpoint = %self.endpoint,
                expired_seconds_ago = -left,
                "the token endpoint gave an expired token; the broker will refuse it"
            );
        }
        tracing::debug!(
            endpoint = %self.endpoint,
            subject = %claims.subject,
            scope = claims.scope.as_deref().unwrap_or(""),
            scope_claim = %self.scope_claim,
            lifetime_s = left,
            "fetched an OAuth token"
        );
        let stale_in =
            Duration::try_from_secs_f64(left.max(0.0) * REFRESH_FACTOR).unwrap_or(Duration::ZERO);
        Ok(Cached {
            token: answer,
            stale_at: Instant::now() + stale_in,
        })
    }
}

/// What a token request needs, moved onto the blocking thread.
struct Request {
    endpoint: String,
    client_id: String,
    client_secret: Secret,
    scope: Option<String>,
    ca: Option<Pem>,
    provider: Option<TlsProvider>,
}

impl Request {
    fn unavailable(&self, detail: String) -> SecurityError {
        SecurityError::TokenEndpoint {
            endpoint: self.endpoint.clone(),
            detail,
        }
    }

    /// POSTs the grant; the access token on success.
    fn send(self) -> Result<Secret, SecurityError> {
        let tls = ureq::tls::TlsConfig::builder()
            .provider(ureq::tls::TlsProvider::Rustls)
            .root_certs(self.roots()?)
            .unversioned_rustls_crypto_provider(self.crypto()?)
            .build();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .tls_config(tls)
            .https_only(true)
            .proxy(None)
            .max_redirects(0)
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT))
            .build()
            .into();
        let credentials = format!("{}:{}", self.client_id, self.client_secret.expose());
        let basic = Secret::new(format!(
            "Basic {}",
            base64::engine::general_purpose::STANDARD.encode(credentials.as_bytes())
        ));
        drop(Secret::new(credentials));
        let mut body = String::from("grant_type=client_credentials");
        if let Some(scope) = &self.scope {
            body.push_str("&scope=");
            body.push_str(&form_encode(scope));
        }
        let mut response = agent
            .post(&self.endpoint)
            .header("Authorization", basic.expose())
            .header("Accept", "application/json")
            .content_type("application/x-www-form-urlencoded")
            .send(&body)
            .map_err(|e| self.unavailable(describe(&e)))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(MAX_ANSWER)
            .read_to_string()
            .map_err(|e| {
                self.unavailable(format!("reading its answer failed: {}", describe(&e)))
            })?;
        let json: Option<serde_json::Value> = serde_json::from_str(&text).ok();
        if !(200..300).contains(&status) {
            // RFC 6749 section 5.2: `error` and `error_description`; never the body itself,
            // which an odd server might fill with the request.
            let reason = json
                .as_ref()
                .map(|j| {
                    [j.get("error"), j.get("error_description")]
                        .into_iter()
                        .flatten()
                        .filter_map(|v| v.as_str())
                        .map(|s| s.chars().take(200).collect::<String>())
                        .collect::<Vec<_>>()
                        .join(": ")
                })
                .filter(|s| !s.is_empty())
                .unwrap_or_else(|| "no OAuth error in the answer".into());
            return Err(if matches!(status, 400 | 401 | 403) {
                SecurityError::TokenRefused {
                    endpoint: self.endpoint.clone(),
                    status,
                    reason,
                }
            } else {
                self.unavailable(format!("it answered HTTP {status} ({reason})"))
            });
        }
        let token = json
            .as_ref()
            .and_then(|j| j.get("access_token"))
            .and_then(|t| t.as_str())
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                self.unavailable(
                    "its answer is not JSON with an access_token (RFC 6749 section 5.1)".into(),
                )
            })?;
        Ok(Secret::new(token))
    }

    fn roots(&self) -> Result<ureq::tls::RootCerts, SecurityError> {
        let Some(ca) = &self.ca else {
            return Ok(ureq::tls::RootCerts::WebPki);
        };
        let bytes = match ca {
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                SecurityError::TlsConfig(format!(
                    "cannot read the token endpoint's CA file (https.ca.location) {}: {e}",
                    path.display()
                ))
            })?,
            Pem::Inline(text) => text.expose().as_bytes().to_vec(),
        };
        let certs: Vec<_> = ureq::tls::parse_pem(&bytes)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(c)) => Some(Ok(c)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<_, _>>()
            .map_err(|e| {
                SecurityError::TlsConfig(format!(
                    "the token endpoint's CA certificates ({ca:?}) are not valid PEM: {e}"
                ))
            })?;
        if certs.is_empty() {
            return Err(SecurityError::TlsConfig(format!(
                "the token endpoint's CA file ({ca:?}) holds no PEM certificate"
            )));
        }
        Ok(ureq::tls::RootCerts::Specific(Arc::new(certs)))
    }

    #[cfg(any(feature = "tls", feature = "tls-graviola"))]
    fn crypto(&self) -> Result<Arc<rustls::crypto::CryptoProvider>, SecurityError> {
        crate::security::crypto_provider(self.provider).map_err(|e| match e {
            crate::Error::Security(s) => s,
            other => SecurityError::TlsConfig(other.to_string()),
        })
    }

    #[cfg(not(any(feature = "tls", feature = "tls-graviola")))]
    fn crypto(&self) -> Result<Arc<rustls::crypto::CryptoProvider>, SecurityError> {
        let _ = self.provider;
        Err(SecurityError::TlsConfig(
            "the OAuth token endpoint needs HTTPS, and this build of kafka-lock has no TLS (the \
             `tls` or `tls-graviola` cargo feature)"
                .into(),
        ))
    }
}

/// ureq's error in words that hold no secret (ureq's messages name the host at most).
fn describe(e: &ureq::Error) -> String {
    match e {
        ureq::Error::ConnectionFailed => "cannot connect to it".into(),
        ureq::Error::HostNotFound => "its host name does not resolve".into(),
        ureq::Error::Timeout(t) => {
            format!("no answer within {REQUEST_TIMEOUT:?} ({t})")
        }
        ureq::Error::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::ConnectionReset
                    | std::io::ErrorKind::AddrNotAvailable
                    | std::io::ErrorKind::HostUnreachable
                    | std::io::ErrorKind::NetworkUnreachable
            ) =>
        {
            format!("cannot connect to it: {io}")
        }
        ureq::Error::Io(io) => format!("cannot talk to it: {io}"),
        other => other.to_string(),
    }
}

/// `application/x-www-form-urlencoded` for one value.
fn form_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                out.push(b as char)
            }
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// The claims kafka-lock reads.
#[derive(Debug, PartialEq)]
struct Claims {
    /// Seconds since the epoch.
    exp: f64,
    subject: String,
    scope: Option<String>,
}

/// Reads the claims of a JWT (not its signature): `exp` and the subject claim are required, as
/// Kafka's `ClientJwtValidator` requires them. Errors never quote the token.
fn claims(token: &Secret, sub_claim: &str) -> Result<Claims, String> {
    let parts: Vec<&str> = token.expose().split('.').collect();
    if parts.len() != 3 {
        return Err(format!(
            "its access token is not a JWT (it has {} dot-separated parts, a JWS has 3)",
            parts.len()
        ));
    }
    let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[1].trim_end_matches('='))
        .map_err(|_| "the access token's payload is not base64url".to_owned())?;
    let json: serde_json::Value = serde_json::from_slice(&payload)
        .map_err(|_| "the access token's payload is not JSON".to_owned())?;
    let exp = json
        .get("exp")
        .and_then(|v| v.as_f64())
        .ok_or_else(|| "the access token has no numeric exp claim".to_owned())?;
    let subject = json
        .get(sub_claim)
        .and_then(|v| v.as_str())
        .filter(|s| !s.trim().is_empty())
        .ok_or_else(|| {
            format!("the access token has no {sub_claim:?} claim (sasl.oauthbearer.sub.claim.name)")
        })?
        .to_owned();
    let scope = json.get("scope").map(|v| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    Ok(Claims {
        exp,
        subject,
        scope,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jwt(payload: &str) -> Secret {
        let b = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        Secret::new(format!("{}.{}.sig", b(r#"{"alg":"ES256"}"#), b(payload)))
    }

    #[test]
    fn reads_exp_and_subject() {
        let c = claims(
            &jwt(r#"{"exp":1700000000,"sub":"locker","scope":"kafka"}"#),
            "sub",
        )
        .unwrap();
        assert_eq!(
            c,
            Claims {
                exp: 1_700_000_000.0,
                subject: "locker".into(),
                scope: Some("kafka".into())
            }
        );
        assert!(claims(&jwt(r#"{"exp":1,"client":"x"}"#), "sub")
            .unwrap_err()
            .contains("\"sub\""));
        assert!(claims(&jwt(r#"{"exp":1,"client":"x"}"#), "client").is_ok());
        assert!(claims(&jwt(r#"{"sub":"x"}"#), "sub")
            .unwrap_err()
            .contains("exp"));
        let opaque = Secret::new("an-opaque-token-value");
        let err = claims(&opaque, "sub").unwrap_err();
        assert!(!err.contains("opaque"), "{err}");
    }

    #[test]
    fn only_https_endpoints() {
        let e = OAuthBearer::client_credentials("http://idp/token", "id", "s".into())
            .unwrap_err()
            .to_string();
        assert!(e.contains("https://"), "{e}");
        assert!(OAuthBearer::client_credentials("https://idp/token", "id", "".into()).is_err());
    }

    #[test]
    fn initial_response_is_rfc7628_with_extensions() {
        let o = OAuthBearer::client_credentials("https://idp/token", "id", "s".into())
            .unwrap()
            .extension("logicalCluster", "lkc-1")
            .unwrap();
        assert!(o.extension("auth", "x").is_err());
        let o = OAuthBearer::client_credentials("https://idp/token", "id", "s".into())
            .unwrap()
            .extension("logicalCluster", "lkc-1")
            .unwrap();
        *o.cache.try_lock().unwrap() = Some(Cached {
            token: Secret::new("T"),
            stale_at: Instant::now() + Duration::from_secs(3600),
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let msg = rt.block_on(o.initial_response()).unwrap();
        assert_eq!(
            msg.expose(),
            "n,,\x01auth=Bearer T\x01logicalCluster=lkc-1\x01\x01"
        );
    }

    #[test]
    fn form_encoding() {
        assert_eq!(form_encode("a b/c:d"), "a+b%2Fc%3Ad");
    }
}

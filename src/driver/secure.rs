//! The secured part of establishing a connection: the TLS handshake on the dialled TCP stream
//! (feature `tls` or `tls-graviola`), and the SASL exchange that follows ApiVersions.
//!
//! ```text
//!  dial (TCP) ─► TLS handshake ─► ApiVersions ─► SaslHandshake ─► SaslAuthenticate … ─► requests
//!               (SSL, SASL_SSL)                  (SASL_PLAINTEXT, SASL_SSL)
//! ```
//!
//! All of it runs inside [`super::Connection::connect`]'s connect timeout. Errors become
//! [`SecurityError`]s that say what to change.

use std::time::Duration;

use bytes::Bytes;
use kafka_protocol::messages::{
    SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
};
use kafka_protocol::protocol::StrBytes;
use tracing::debug;

use crate::error::{Error, Result};
use crate::security::{Sasl, SaslKind, SaslMechanism, Secret, SecurityError};
use crate::wire::code::KafkaCode;
use crate::wire::sasl::{plain_message, ScramClient, ScramError, ScramHash};
use crate::wire::{NegotiatedVersions, Request, Response};

/// What SaslAuthenticate told us about the session.
pub(super) struct Authenticated {
    /// KIP-368's `session_lifetime_ms`: the broker closes the connection at the first request
    /// after this much time unless it re-authenticated; `None` when the broker sets no limit.
    pub(super) lifetime: Option<Duration>,
}

/// Sends one request on the connection being set up.
pub(super) trait Exchange {
    async fn exchange(&self, req: Request, version: i16) -> Result<Response>;
}

/// SaslHandshake v1 and the SaslAuthenticate exchange of `sasl` (KIP-152 framing).
pub(super) async fn authenticate(
    link: &impl Exchange,
    versions: &NegotiatedVersions,
    sasl: &Sasl,
    peer: &str,
) -> Result<Authenticated> {
    let mechanism = sasl.mechanism_name().to_owned();
    let user = sasl.username().unwrap_or_default().to_owned();
    let version = handshake(link, versions, peer, &mechanism).await?;
    debug!(peer, %mechanism, "SASL handshake accepted");

    let who = Who {
        peer,
        mechanism: &mechanism,
        user: &user,
        version,
    };
    let last = match &sasl.0 {
        SaslKind::Password {
            mechanism: SaslMechanism::Plain,
            username,
            password,
        } => {
            let msg = plain_message(username, password.expose());
            who.auth(link, Bytes::copy_from_slice(&msg)).await?
        }
        SaslKind::Password {
            mechanism,
            username,
            password,
        } => scram(&who, link, *mechanism, username, password).await?,
        SaslKind::Token(provider) => {
            let msg = provider.initial_response(peer).await.map_err(|reason| {
                Error::Security(SecurityError::AuthenticationFailed {
                    broker: peer.to_owned(),
                    mechanism: mechanism.clone(),
                    user: String::new(),
                    message: format!("the token provider failed: {reason}"),
                })
            })?;
            let answer = who
                .auth(link, Bytes::copy_from_slice(msg.expose().as_bytes()))
                .await?;
            if mechanism.eq_ignore_ascii_case("OAUTHBEARER") {
                oauthbearer_outcome(&who, link, answer).await?
            } else {
                answer
            }
        }
        #[cfg(feature = "oauth")]
        SaslKind::OAuth(oauth) => {
            let msg = oauth.initial_response().await?;
            let answer = who
                .auth(link, Bytes::copy_from_slice(msg.expose().as_bytes()))
                .await?;
            oauthbearer_outcome(&who, link, answer).await?
        }
    };
    let ms = last.session_lifetime_ms;
    let lifetime = (ms > 0).then(|| Duration::from_millis(ms as u64));
    debug!(peer, %mechanism, ?lifetime, "SASL authenticated");
    Ok(Authenticated { lifetime })
}

/// SaslHandshake v1 for `mechanism`; answers the SaslAuthenticate version to use.
async fn handshake(
    link: &impl Exchange,
    versions: &NegotiatedVersions,
    peer: &str,
    mechanism: &str,
) -> Result<i16> {
    let protocol_error = |detail: String| sasl_protocol_error(peer, mechanism, detail);
    // v0 of SaslHandshake means the unframed exchange of Kafka 0.10, which kafka-lock does
    // not speak; every broker since 1.0 offers v1 and SaslAuthenticate.
    let (Some(1..), Some(auth_version)) = (
        versions.get(kafka_protocol::messages::ApiKey::SaslHandshake),
        versions.get(kafka_protocol::messages::ApiKey::SaslAuthenticate),
    ) else {
        return Err(protocol_error(
            "the broker offers no SaslHandshake v1 and SaslAuthenticate (Kafka 1.0 or newer); \
             is this a SASL listener?"
                .into(),
        ));
    };
    let req =
        SaslHandshakeRequest::default().with_mechanism(StrBytes::from_string(mechanism.to_owned()));
    let Response::SaslHandshake(resp) = link.exchange(req.into(), 1).await? else {
        return Err(protocol_error(
            "SaslHandshake answered with another response".into(),
        ));
    };
    let enabled: Vec<String> = resp.mechanisms.iter().map(|m| m.to_string()).collect();
    match KafkaCode(resp.error_code) {
        KafkaCode::NONE => Ok(auth_version),
        KafkaCode(33) => Err(Error::Security(SecurityError::MechanismNotEnabled {
            broker: peer.to_owned(),
            mechanism: mechanism.to_owned(),
            enabled,
        })),
        code => Err(protocol_error(format!("SaslHandshake failed: {code}"))),
    }
}

/// The SCRAM exchange (RFC 5802): client-first, server-first, client-final, server-final;
/// answers the last SaslAuthenticate response.
async fn scram(
    who: &Who<'_>,
    link: &impl Exchange,
    mechanism: SaslMechanism,
    username: &str,
    password: &Secret,
) -> Result<SaslAuthenticateResponse> {
    let hash = match mechanism {
        SaslMechanism::ScramSha256 => ScramHash::Sha256,
        _ => ScramHash::Sha512,
    };
    let scram_error = |e: ScramError| match e {
        // e= in server-first (RFC 5802: e.g. unknown-user) is an authentication
        // failure, not a protocol error.
        ScramError::Server(m) => Error::Security(SecurityError::AuthenticationFailed {
            broker: who.peer.to_owned(),
            mechanism: mechanism.to_string(),
            user: username.to_owned(),
            message: m,
        }),
        other => who.protocol_error(other.to_string()),
    };
    let mut client = ScramClient::new(hash, username, password.expose(), nonce());
    let first = who.auth(link, Bytes::from(client.client_first())).await?;
    // PBKDF2 runs for milliseconds: off the runtime, so a holder's heartbeat on the same
    // thread is not delayed by it.
    let server_first = first.auth_bytes.to_vec();
    let (client, final_msg) = tokio::task::spawn_blocking(move || {
        let r = client.server_first(&server_first);
        (client, r)
    })
    .await
    .map_err(|e| who.protocol_error(format!("the SCRAM computation failed: {e}")))?;
    let mut client = client;
    let final_msg = final_msg.map_err(scram_error)?;
    let last = who.auth(link, Bytes::copy_from_slice(&final_msg)).await?;
    client.server_final(&last.auth_bytes).map_err(scram_error)?;
    Ok(last)
}

/// RFC 7628 section 3.2.2: a server that refuses the token answers with a JSON error (`status`,
/// `scope`, `openid-configuration`) instead of failing at once, and fails the exchange only after
/// the client's `%x01`, as Kafka's `OAuthBearerSaslServer` does. An empty answer is success.
async fn oauthbearer_outcome(
    who: &Who<'_>,
    link: &impl Exchange,
    answer: SaslAuthenticateResponse,
) -> Result<SaslAuthenticateResponse> {
    if answer.auth_bytes.is_empty() {
        return Ok(answer);
    }
    let challenge: String = String::from_utf8_lossy(&answer.auth_bytes)
        .chars()
        .filter(|c| !c.is_control())
        .take(300)
        .collect();
    let refused = |message: String| {
        Error::Security(SecurityError::AuthenticationFailed {
            broker: who.peer.to_owned(),
            mechanism: who.mechanism.to_owned(),
            user: String::new(),
            message: format!("the broker refused the token ({challenge}){message}"),
        })
    };
    match who.auth(link, Bytes::from_static(b"\x01")).await {
        Err(Error::Security(SecurityError::AuthenticationFailed { message, .. })) => {
            Err(refused(format!(": {message}")))
        }
        Err(other) => Err(other),
        Ok(_) => Err(refused(String::new())),
    }
}

fn sasl_protocol_error(peer: &str, mechanism: &str, detail: String) -> Error {
    Error::Security(SecurityError::SaslProtocol {
        broker: peer.to_owned(),
        mechanism: mechanism.to_owned(),
        detail,
    })
}

/// Names the exchange in errors.
struct Who<'a> {
    peer: &'a str,
    mechanism: &'a str,
    user: &'a str,
    version: i16,
}

impl Who<'_> {
    fn protocol_error(&self, detail: String) -> Error {
        sasl_protocol_error(self.peer, self.mechanism, detail)
    }

    /// One SaslAuthenticate round trip; an error code becomes an error.
    async fn auth(&self, link: &impl Exchange, bytes: Bytes) -> Result<SaslAuthenticateResponse> {
        let req = SaslAuthenticateRequest::default().with_auth_bytes(bytes);
        let Response::SaslAuthenticate(resp) = link.exchange(req.into(), self.version).await?
        else {
            return Err(
                self.protocol_error("SaslAuthenticate answered with another response".into())
            );
        };
        match KafkaCode(resp.error_code) {
            KafkaCode::NONE => Ok(resp),
            KafkaCode(58) => Err(Error::Security(SecurityError::AuthenticationFailed {
                broker: self.peer.to_owned(),
                mechanism: self.mechanism.to_owned(),
                user: self.user.to_owned(),
                message: resp
                    .error_message
                    .as_deref()
                    .filter(|m| !m.is_empty())
                    .unwrap_or("the broker gave no reason")
                    .chars()
                    .take(300)
                    .collect(),
            })),
            code => Err(self.protocol_error(format!(
                "SaslAuthenticate failed: {code}{}",
                resp.error_message
                    .as_deref()
                    .map(|m| format!(" ({m})"))
                    .unwrap_or_default()
            ))),
        }
    }
}

/// A number in [0, 1) for the re-authentication jitter; the standard library's hasher keys are
/// random per process, which is all a jitter needs.
pub(super) fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::UNIX_EPOCH
            .elapsed()
            .map_or(0, |d| d.as_nanos()),
    );
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

/// A SCRAM client nonce: 18 random bytes, base64 (24 printable characters, no comma).
fn nonce() -> String {
    use base64::Engine as _;
    let mut bytes = [0u8; 18];
    let from_os = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .is_ok();
    if !from_os {
        // The standard library's hasher keys come from the operating system's random source.
        use std::hash::{BuildHasher, Hasher};
        for chunk in bytes.chunks_mut(8) {
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(
                std::time::SystemTime::now()
                    .elapsed()
                    .map_or(0, |d| d.as_nanos() as u64),
            );
            let v = h.finish().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(any(feature = "tls", feature = "tls-graviola"))]
pub(super) use tls::connect as tls_connect;

#[cfg(any(feature = "tls", feature = "tls-graviola"))]
mod tls {
    use std::io;
    use std::net::IpAddr;
    use std::sync::{Arc, LazyLock};

    use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
    use rustls::client::WebPkiServerVerifier;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
    use rustls::{
        CertificateError, ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme,
    };
    use tokio::net::TcpStream;
    use tracing::warn;

    use crate::error::{Error, Result};
    use crate::security::{crypto_provider, Pem, SecurityError, Tls};

    /// The stream a TLS connection runs over.
    pub(crate) type TlsStream = tokio_rustls::client::TlsStream<TcpStream>;

    /// The rustls provider for `tls`'s choice, once this build and CPU are known to run it.
    fn provider(tls: &Tls) -> Result<Arc<rustls::crypto::CryptoProvider>> {
        crypto_provider(tls.effective_provider())
    }

    /// Mozilla's roots, parsed once.
    static BUNDLED: LazyLock<Arc<RootCertStore>> = LazyLock::new(|| {
        Arc::new(RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        })
    });

    fn config_error(what: String) -> Error {
        Error::Security(SecurityError::TlsConfig(what))
    }

    fn read_pem(pem: &Pem, what: &str) -> Result<Vec<u8>> {
        match pem {
            Pem::File(path) => std::fs::read(path).map_err(|e| {
                config_error(format!(
                    "cannot read the {what} file {}: {e}",
                    path.display()
                ))
            }),
            Pem::Inline(text) => Ok(text.expose().as_bytes().to_vec()),
        }
    }

    fn certs(pem: &Pem, what: &str) -> Result<Vec<CertificateDer<'static>>> {
        let bytes = read_pem(pem, what)?;
        let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
            .collect::<std::result::Result<_, _>>()
            .map_err(|e| config_error(format!("the {what} ({pem:?}) is not valid PEM: {e}")))?;
        if certs.is_empty() {
            return Err(config_error(format!(
                "the {what} ({pem:?}) holds no PEM certificate"
            )));
        }
        Ok(certs)
    }

    /// The rustls configuration for `tls`, read afresh on every connection so that rotated
    /// certificate files are picked up.
    fn client_config(tls: &Tls) -> Result<ClientConfig> {
        let provider = provider(tls)?;
        let roots = match &tls.ca {
            None => Arc::clone(&BUNDLED),
            Some(pem) => {
                let mut store = RootCertStore::empty();
                for cert in certs(pem, "CA certificate (ssl.ca.location)")? {
                    store.add(cert).map_err(|e| {
                        config_error(format!("a CA certificate in {pem:?} is unusable: {e}"))
                    })?;
                }
                Arc::new(store)
            }
        };
        let webpki = WebPkiServerVerifier::builder_with_provider(roots, Arc::clone(&provider))
            .build()
            .map_err(|e| config_error(format!("no usable CA certificate: {e}")))?;
        let verifier: Arc<dyn ServerCertVerifier> = if tls.verify_hostname {
            webpki
        } else {
            Arc::new(AnyName(webpki))
        };
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| config_error(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier);
        match &tls.client_cert {
            None => Ok(builder.with_no_client_auth()),
            Some((cert, key)) => {
                let chain = certs(cert, "client certificate (ssl.certificate.location)")?;
                let key_bytes =
                    zeroize::Zeroizing::new(read_pem(key, "client key (ssl.key.location)")?);
                let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| {
                    config_error(format!(
                        "the client key ({key:?}) is not an unencrypted PEM private key \
                         (PKCS#8, PKCS#1 or SEC1): {e}"
                    ))
                })?;
                builder.with_client_auth_cert(chain, key).map_err(|e| {
                    config_error(format!(
                        "the client certificate and key do not fit together: {e}"
                    ))
                })
            }
        }
    }

    /// Wraps `tcp` in TLS to `addr` (`host:port`): SNI and the name verified are the host, an
    /// IP address is verified against the certificate's IP SANs.
    pub(crate) async fn connect(tcp: TcpStream, addr: &str, tls: &Tls) -> Result<TlsStream> {
        let config = client_config(tls)?;
        let host = addr
            .rsplit_once(':')
            .map_or(addr, |(h, _)| h)
            .trim_start_matches('[')
            .trim_end_matches(']');
        let name = match host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(host.to_owned()).map_err(|e| {
                config_error(format!("{host:?} is not a valid TLS server name: {e}"))
            })?,
        };
        if !tls.verify_hostname {
            warn!(broker = addr, "TLS hostname verification is off: any certificate from a trusted CA is accepted for this broker");
        }
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        connector
            .connect(name, tcp)
            .await
            .map_err(|e| classify(e, addr, host))
    }

    fn classify(e: io::Error, addr: &str, host: &str) -> Error {
        let broker = addr.to_owned();
        let inner = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>());
        let sec = match inner {
            Some(rustls::Error::InvalidCertificate(cert)) => match cert {
                CertificateError::UnknownIssuer => SecurityError::UnknownCa {
                    broker,
                    detail: cert.to_string(),
                },
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    SecurityError::HostnameMismatch {
                        broker,
                        host: host.to_owned(),
                        detail: cert.to_string(),
                    }
                }
                other => SecurityError::Tls {
                    broker,
                    detail: format!("the broker's certificate is not acceptable: {other}"),
                },
            },
            Some(rustls::Error::InvalidMessage(m)) => SecurityError::PlaintextListener {
                broker,
                detail: format!("it sent bytes that are not TLS: {m:?}"),
            },
            Some(other) => SecurityError::Tls {
                broker,
                detail: other.to_string(),
            },
            None if e.kind() == io::ErrorKind::UnexpectedEof
                || e.kind() == io::ErrorKind::ConnectionReset =>
            {
                SecurityError::PlaintextListener {
                    broker,
                    detail: "it closed the connection on the TLS ClientHello".into(),
                }
            }
            None => {
                return Error::Io {
                    op: "TLS handshake",
                    source: io::Error::new(e.kind(), format!("with {addr}: {e}")),
                }
            }
        };
        Error::Security(sec)
    }

    /// The chain is verified as usual; the name is not (`ssl.endpoint.identification.algorithm`
    /// set empty).
    #[derive(Debug)]
    struct AnyName(Arc<WebPkiServerVerifier>);

    impl ServerCertVerifier for AnyName {
        fn verify_server_cert(
            &self,
            end_entity: &CertificateDer<'_>,
            intermediates: &[CertificateDer<'_>],
            server_name: &ServerName<'_>,
            ocsp_response: &[u8],
            now: UnixTime,
        ) -> std::result::Result<ServerCertVerified, rustls::Error> {
            // WebPkiServerVerifier checks the chain before the name, so a name error means the
            // chain was good.
            match self.0.verify_server_cert(
                end_entity,
                intermediates,
                server_name,
                ocsp_response,
                now,
            ) {
                Err(rustls::Error::InvalidCertificate(
                    CertificateError::NotValidForName
                    | CertificateError::NotValidForNameContext { .. },
                )) => Ok(ServerCertVerified::assertion()),
                other => other,
            }
        }

        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls12_signature(message, cert, dss)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
            self.0.verify_tls13_signature(message, cert, dss)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.0.supported_verify_schemes()
        }
    }
}

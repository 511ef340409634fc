//! An Apache Kafka node that signs clients in with SASL/OAUTHBEARER and Kafka's own OIDC
//! validator (`OAuthBearerValidatorCallbackHandler`, KIP-768), and the identity provider it
//! trusts: an HTTPS token endpoint on loopback, run by the test, that issues ES256 JWTs for the
//! client credentials grant, with the public key in a JWKS file the broker reads.
//!
//! What the endpoint issues depends on the client id, so one endpoint serves every case:
//!
//! | client id | token |
//! |---|---|
//! | [`GOOD`] | valid for [`TOKEN_LIFETIME`], audience [`AUDIENCE`] |
//! | [`EXPIRED`] | expired ten minutes ago (beyond the validator's 30 s clock skew) |
//! | [`WRONG_AUDIENCE`] | valid, for another audience |
//! | any other | HTTP 401 `invalid_client` |
//!
//! Every client must send [`CLIENT_SECRET`]; a wrong one is answered 401 too. The broker's
//! listeners `OAUTH` (SASL_PLAINTEXT, with `connections.max.reauth.ms` of a minute, so the
//! session lifetime the broker grants is the token's remaining life, KIP-368) and `OAUTH_SSL`
//! (SASL_SSL, its certificate from the IdP's CA) take OAUTHBEARER only.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, SystemTime};

use base64::Engine as _;
use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, KeyPair as _, ECDSA_P256_SHA256_FIXED_SIGNING};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::scratch::ScratchDir;
use super::secure::make_ca;
use super::{KafkaCluster, KafkaOptions};

/// The client id that gets good tokens.
pub const GOOD: &str = "good-client";
/// The client id that gets expired tokens.
pub const EXPIRED: &str = "expired-client";
/// The client id that gets tokens for another audience.
pub const WRONG_AUDIENCE: &str = "wrong-audience-client";
/// Every client's secret.
pub const CLIENT_SECRET: &str = "oauth-secret-Vb8n";
/// The audience the broker expects.
pub const AUDIENCE: &str = "kafka-lock-test";
/// The issuer the broker expects.
pub const ISSUER: &str = "kafka-lock-test-idp";
/// How long a good token lives: short, so a test sees re-authentication with fresh tokens.
pub const TOKEN_LIFETIME: Duration = Duration::from_secs(8);

/// The identity provider and the node that trusts it.
pub struct OAuthKafka {
    // Before the files: the JVM goes before the JWKS it reads.
    cluster: KafkaCluster,
    idp: Idp,
    _dir: ScratchDir,
}

/// The token endpoint: its URL, its CA, and how many tokens it issued to each client.
pub struct Idp {
    /// `https://127.0.0.1:PORT/token`.
    pub url: String,
    /// The PEM file of the CA that signed the endpoint's certificate.
    pub ca: PathBuf,
    issued: Arc<Mutex<HashMap<String, usize>>>,
}

impl Idp {
    /// Tokens issued so far to `client`.
    pub fn issued(&self, client: &str) -> usize {
        *self.issued.lock().unwrap().get(client).unwrap_or(&0)
    }
}

/// The shared OAuth node, started on first use.
pub fn oauth_kafka() -> &'static OAuthKafka {
    static SHARED: OnceLock<OAuthKafka> = OnceLock::new();
    SHARED.get_or_init(OAuthKafka::start)
}

impl OAuthKafka {
    fn start() -> OAuthKafka {
        let dir = ScratchDir::new("oauth");
        let rng = SystemRandom::new();
        let pkcs8 = EcdsaKeyPair::generate_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, &rng)
            .expect("generate the signing key");
        let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_FIXED_SIGNING, pkcs8.as_ref(), &rng)
            .expect("load the signing key");
        let point = key.public_key().as_ref();
        let jwks = serde_json::json!({"keys": [{
            "kty": "EC", "crv": "P-256", "kid": "test-key", "alg": "ES256", "use": "sig",
            "x": b64(&point[1..33]), "y": b64(&point[33..65]),
        }]});
        let jwks_path = dir.path().join("jwks.json");
        std::fs::write(&jwks_path, jwks.to_string()).expect("write the JWKS");
        let (idp, keystore) = Idp::start(&dir, key);

        let jwks_url = format!("file:{}", jwks_path.display());
        let options = KafkaOptions::single_node()
            .listener("OAUTH", "SASL_PLAINTEXT")
            .listener("OAUTH_SSL", "SASL_SSL")
            // The broker's certificate comes from the IdP's CA (one trust file for the tests).
            .property("ssl.keystore.type", "PEM")
            .property("ssl.keystore.location", keystore.display())
            .property("sasl.oauthbearer.jwks.endpoint.url", &jwks_url)
            .property("sasl.oauthbearer.expected.audience", AUDIENCE)
            .property("sasl.oauthbearer.expected.issuer", ISSUER)
            .property("listener.name.oauth.connections.max.reauth.ms", 60_000)
            // Kafka 4 reaches only the OAuth URLs and files these system properties list
            // (ConfigurationUtils.throwIfURLIsNotAllowed / throwIfFileIsNotAllowed).
            .jvm_property("org.apache.kafka.sasl.oauthbearer.allowed.urls", &jwks_url)
            .jvm_property(
                "org.apache.kafka.sasl.oauthbearer.allowed.files",
                jwks_path.display(),
            );
        let mut options = options;
        for listener in ["oauth", "oauth_ssl"] {
            options = options
                .property(
                    &format!("listener.name.{listener}.sasl.enabled.mechanisms"),
                    "OAUTHBEARER",
                )
                .property(
                    &format!("listener.name.{listener}.oauthbearer.sasl.jaas.config"),
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required ;",
                )
                .property(
                    &format!("listener.name.{listener}.oauthbearer.sasl.server.callback.handler.class"),
                    "org.apache.kafka.common.security.oauthbearer.OAuthBearerValidatorCallbackHandler",
                );
        }
        let cluster = KafkaCluster::start(options);
        OAuthKafka {
            cluster,
            idp,
            _dir: dir,
        }
    }

    /// `127.0.0.1:PORT` of the SASL_PLAINTEXT OAUTHBEARER listener.
    pub fn addr(&self) -> String {
        self.cluster.nodes()[0].listener_addr("OAUTH")
    }

    /// `127.0.0.1:PORT` of the SASL_SSL OAUTHBEARER listener, whose certificate is signed by
    /// [`Idp::ca`].
    pub fn ssl_addr(&self) -> String {
        self.cluster.nodes()[0].listener_addr("OAUTH_SSL")
    }

    /// The token endpoint.
    pub fn idp(&self) -> &Idp {
        &self.idp
    }

    /// The broker's log, for failure messages.
    pub fn log_tail(&self) -> String {
        self.cluster.nodes()[0].log_tail(60)
    }
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// An ES256 JWT for `sub`.
fn jwt(key: &EcdsaKeyPair, sub: &str, audience: &str, iat: u64, exp: u64) -> String {
    let header = b64(br#"{"alg":"ES256","typ":"JWT","kid":"test-key"}"#);
    let claims = serde_json::json!({
        "iss": ISSUER, "aud": audience, "sub": sub, "scope": "kafka", "iat": iat, "exp": exp,
    });
    let payload = b64(claims.to_string().as_bytes());
    let signing_input = format!("{header}.{payload}");
    let sig = key
        .sign(&SystemRandom::new(), signing_input.as_bytes())
        .expect("sign");
    format!("{signing_input}.{}", b64(sig.as_ref()))
}

impl Idp {
    /// Serves the token endpoint on a thread of its own (with its own runtime, since the tests'
    /// runtimes come and go) for as long as the test binary runs.
    /// Also returns the PEM key store (key, certificate, CA) the broker's TLS listener uses.
    fn start(dir: &ScratchDir, key: EcdsaKeyPair) -> (Idp, PathBuf) {
        let ca = make_ca("kafka-lock test IdP CA");
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).expect("params");
        params
            .distinguished_name
            .push(DnType::CommonName, "127.0.0.1");
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let leaf_key = KeyPair::generate().expect("key");
        let leaf = params.signed_by(&leaf_key, &ca).expect("sign");
        let ca_path = dir.path().join("idp-ca.pem");
        std::fs::write(&ca_path, ca.pem()).expect("write the IdP CA");
        let keystore = dir.path().join("server.pem");
        std::fs::write(
            &keystore,
            format!("{}{}{}", leaf_key.serialize_pem(), leaf.pem(), ca.pem()),
        )
        .expect("write the broker's key store");

        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                rustls::pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der())
                    .expect("key der"),
            )
            .expect("server config");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the IdP");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().unwrap().port();
        let issued = Arc::new(Mutex::new(HashMap::new()));
        let counts = Arc::clone(&issued);
        let key = Arc::new(key);
        std::thread::Builder::new()
            .name("test-idp".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                    loop {
                        let Ok((tcp, _)) = listener.accept().await else {
                            continue;
                        };
                        let acceptor = acceptor.clone();
                        let key = Arc::clone(&key);
                        let counts = Arc::clone(&counts);
                        tokio::spawn(async move {
                            if let Ok(tls) = acceptor.accept(tcp).await {
                                let _ = tokio::time::timeout(
                                    Duration::from_secs(10),
                                    serve(tls, &key, &counts),
                                )
                                .await;
                            }
                        });
                    }
                })
            })
            .expect("spawn the IdP thread");
        let idp = Idp {
            url: format!("https://127.0.0.1:{port}/token"),
            ca: ca_path,
            issued,
        };
        (idp, keystore)
    }
}

/// One request: a client credentials grant, answered per the module's table.
async fn serve(
    mut stream: tokio_rustls::server::TlsStream<tokio::net::TcpStream>,
    key: &EcdsaKeyPair,
    counts: &Mutex<HashMap<String, usize>>,
) -> std::io::Result<()> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
    let header = |name: &str| {
        head.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_owned())
        })
    };
    let length: usize = header("content-length")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..]).to_string();
    let credentials = header("authorization")
        .and_then(|v| v.strip_prefix("Basic ").map(str::to_owned))
        .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok())
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.split_once(':').map(|(a, b)| (a.to_owned(), b.to_owned())));
    let grant_ok = head.starts_with("POST /token ")
        && body
            .split('&')
            .any(|p| p == "grant_type=client_credentials");
    let now = now();
    let token = match credentials {
        Some((id, secret)) if grant_ok && secret == CLIENT_SECRET => match id.as_str() {
            GOOD => Some((
                id,
                jwt(key, GOOD, AUDIENCE, now, now + TOKEN_LIFETIME.as_secs()),
            )),
            EXPIRED => Some((id, jwt(key, EXPIRED, AUDIENCE, now - 1200, now - 600))),
            WRONG_AUDIENCE => Some((id, jwt(key, WRONG_AUDIENCE, "someone-else", now, now + 600))),
            _ => None,
        },
        _ => None,
    };
    let (status, json) = match token {
        Some((id, token)) => {
            *counts.lock().unwrap().entry(id).or_default() += 1;
            (
                "200 OK",
                serde_json::json!({"access_token": token, "token_type": "Bearer", "expires_in": 8}),
            )
        }
        None => (
            "401 Unauthorized",
            serde_json::json!({"error": "invalid_client", "error_description": "unknown client or wrong secret"}),
        ),
    };
    let json = json.to_string();
    let answer = format!(
        "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{json}",
        json.len()
    );
    stream.write_all(answer.as_bytes()).await?;
    stream.shutdown().await
}

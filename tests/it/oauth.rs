//! SASL/OAUTHBEARER against Apache Kafka's OIDC validator, with tokens from the test's token
//! endpoint (tests/it/support/kafka/oauth.rs): a good token holds the lock across
//! re-authentications with fresh tokens; an expired token, a token for another audience, a
//! refused client and an unreachable endpoint each fail with their own typed error.

use std::time::{Duration, Instant};

use kafka_lock::{ClientConfig, Error, LockOptions, SecurityError};

use crate::support::kafka::oauth::{
    oauth_kafka, CLIENT_SECRET, EXPIRED, GOOD, TOKEN_LIFETIME, WRONG_AUDIENCE,
};
use crate::support::unique_group;

/// Bounds an acquire, the broker's start included.
const WAIT: Duration = Duration::from_secs(60);

/// Kafka client settings for `client`, as a client.properties would give them.
fn options(client: &str, secret: &str, endpoint: &str, prefix: &str) -> LockOptions {
    let k = oauth_kafka();
    let text = format!(
        "bootstrap.servers={}\n\
         security.protocol=SASL_PLAINTEXT\n\
         sasl.mechanism=OAUTHBEARER\n\
         sasl.login.callback.handler.class=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginCallbackHandler\n\
         sasl.oauthbearer.token.endpoint.url={endpoint}\n\
         https.ca.location={}\n\
         sasl.jaas.config=org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule required \
         clientId=\"{client}\" clientSecret=\"{secret}\" scope=\"kafka\";\n",
        k.addr(),
        k.idp().ca.display()
    );
    ClientConfig::from_properties(&text, "oauth test")
        .expect("settings")
        .lock_options(unique_group(prefix))
        .expect("options")
}

/// The security error inside `err` (through bootstrap attempts and poisoned connections).
fn security_error(err: &Error) -> Option<&SecurityError> {
    match err {
        Error::Security(e) => Some(e),
        Error::Poisoned(e) => security_error(e),
        Error::Bootstrap(b) => b.attempts.iter().find_map(|a| security_error(&a.error)),
        _ => None,
    }
}

async fn acquire_error(options: LockOptions) -> Error {
    let started = Instant::now();
    let err = match tokio::time::timeout(WAIT * 2, options.acquire(Some(WAIT))).await {
        Err(_) => panic!("acquire did not end within {:?}", WAIT * 2),
        Ok(Ok(_)) => panic!("acquired with a token that should be refused"),
        Ok(Err(e)) => e,
    };
    assert!(
        started.elapsed() < Duration::from_secs(40),
        "a refusal took {:?}: {err}",
        started.elapsed()
    );
    assert!(!err.to_string().contains(CLIENT_SECRET), "{err}");
    err
}

/// A good token: the lock is held across at least two session deadlines (the broker caps each
/// session at the token's expiry), every re-authentication fetching a fresh token.
#[tokio::test]
async fn good_token_holds_across_reauthentication_with_fresh_tokens() {
    crate::support::init_tracing();
    let k = oauth_kafka();
    let opts = options(GOOD, CLIENT_SECRET, &k.idp().url, "oauth-good");
    let guard = tokio::time::timeout(WAIT * 2, opts.acquire(Some(WAIT)))
        .await
        .expect("acquire within its bound")
        .unwrap_or_else(|e| panic!("acquire: {e}\n{}", k.log_tail()));
    let before = k.idp().issued(GOOD);
    let until = Instant::now() + TOKEN_LIFETIME * 5 / 2;
    while Instant::now() < until {
        assert!(guard.is_held(), "the hold ended\n{}", k.log_tail());
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(guard.is_held());
    let fetched = k.idp().issued(GOOD) - before;
    assert!(
        fetched >= 2,
        "{fetched} tokens fetched while holding for 2.5 token lifetimes"
    );
    tokio::time::timeout(WAIT, guard.release())
        .await
        .expect("release within its bound")
        .expect("release");
    let stats = opts.stats();
    assert!(stats.losses.iter().all(|(_, n)| *n == 0), "{stats:?}");
}

/// OAUTHBEARER inside TLS, with each TLS provider the build has, chosen with the
/// `ssl.crypto.provider` setting (which the token endpoint's HTTPS uses too).
#[tokio::test]
async fn sasl_ssl_with_each_tls_provider() {
    let k = oauth_kafka();
    for provider in kafka_lock::TlsProvider::compiled() {
        let text = format!(
            "bootstrap.servers={}\n\
             security.protocol=SASL_SSL\n\
             ssl.ca.location={ca}\n\
             ssl.crypto.provider={provider}\n\
             sasl.mechanism=OAUTHBEARER\n\
             sasl.oauthbearer.token.endpoint.url={}\n\
             https.ca.location={ca}\n\
             sasl.oauthbearer.client.credentials.client.id={GOOD}\n\
             sasl.oauthbearer.client.credentials.client.secret={CLIENT_SECRET}\n",
            k.ssl_addr(),
            k.idp().url,
            ca = k.idp().ca.display()
        );
        let opts = ClientConfig::from_properties(&text, "oauth ssl test")
            .expect("settings")
            .lock_options(unique_group("oauth-ssl"))
            .expect("options");
        let tls = opts.security_settings().tls.clone().expect("tls");
        assert_eq!(tls.provider, Some(*provider));
        let guard = tokio::time::timeout(WAIT * 2, opts.acquire(Some(WAIT)))
            .await
            .expect("acquire within its bound")
            .unwrap_or_else(|e| panic!("acquire with {provider}: {e}\n{}", k.log_tail()));
        tokio::time::timeout(WAIT, guard.release())
            .await
            .expect("release within its bound")
            .expect("release");
    }
}

/// A token that expired ten minutes ago is refused by the broker's validator.
#[tokio::test]
async fn expired_token_is_refused_by_the_broker() {
    let k = oauth_kafka();
    let err = acquire_error(options(EXPIRED, CLIENT_SECRET, &k.idp().url, "oauth-exp")).await;
    match security_error(&err) {
        Some(SecurityError::AuthenticationFailed { mechanism, .. }) => {
            assert_eq!(mechanism, "OAUTHBEARER")
        }
        other => panic!("expected an authentication failure, got {other:?}: {err}"),
    }
    assert!(err.auth_failure().is_some());
}

/// A token for another audience is refused by the broker's validator.
#[tokio::test]
async fn wrong_audience_is_refused_by_the_broker() {
    let k = oauth_kafka();
    let err = acquire_error(options(
        WRONG_AUDIENCE,
        CLIENT_SECRET,
        &k.idp().url,
        "oauth-aud",
    ))
    .await;
    assert!(
        matches!(
            security_error(&err),
            Some(SecurityError::AuthenticationFailed { .. })
        ),
        "{err:?}"
    );
}

/// The token endpoint refuses a wrong client secret: an authentication failure that says so,
/// without the secret.
#[tokio::test]
async fn wrong_client_secret_is_refused_by_the_token_endpoint() {
    let k = oauth_kafka();
    let err = acquire_error(options(GOOD, "not-the-secret", &k.idp().url, "oauth-401")).await;
    match security_error(&err) {
        Some(SecurityError::TokenRefused { status, reason, .. }) => {
            assert_eq!(*status, 401);
            assert!(reason.contains("invalid_client"), "{reason}");
        }
        other => panic!("expected TokenRefused, got {other:?}: {err}"),
    }
    assert!(!err.to_string().contains("not-the-secret"), "{err}");
    assert!(err.auth_failure().is_some());
}

/// A token endpoint nobody listens on: its own error, not an authentication failure.
#[tokio::test]
async fn token_endpoint_down() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let url = format!("https://127.0.0.1:{port}/token");
    let err = acquire_error(options(GOOD, CLIENT_SECRET, &url, "oauth-down")).await;
    match security_error(&err) {
        Some(SecurityError::TokenEndpoint { endpoint, detail }) => {
            assert_eq!(endpoint, &url);
            assert!(detail.contains("connect"), "{detail}");
        }
        other => panic!("expected TokenEndpoint, got {other:?}: {err}"),
    }
    assert!(err.auth_failure().is_none(), "{err}");
}

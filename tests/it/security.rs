//! Secured connections on real Apache Kafka (`support::kafka::secure`): the lock over SASL_SSL
//! with each mechanism, mTLS, SASL_PLAINTEXT, KIP-368 re-authentication across a long hold, the
//! one-line error of each misconfiguration, and secrets kept out of logs and `Debug`. Every test
//! that makes TLS connections runs once per crypto provider the build has
//! (`security::ring::…`, `security::graviola::…`; `--all-features` has both).

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kafka_lock::internals::driver::{ConnConfig, Connection};
use kafka_lock::{
    AuthFailure, Error, LockOptions, Sasl, SaslMechanism, Secret, Security, SecurityError,
    SecurityProtocol, Tls, TlsProvider,
};
use kafka_protocol::messages::MetadataRequest;

use crate::support::kafka::secure::{
    secure_kafka, CLIENT_CN, NOBODY, PLAIN_USER, REAUTH_MS, SCRAM256_USER, SCRAM512_USER,
    SECURE_WAIT,
};
use crate::support::unique_group;

/// Defines each named `async fn(TlsProvider)` as a test in `ring` (feature `tls`) and in
/// `graviola` (feature `tls-graviola`).
macro_rules! per_provider {
    ($($test:ident),* $(,)?) => {
        #[cfg(feature = "tls")]
        mod ring {
            $(#[tokio::test]
            async fn $test() {
                super::$test(kafka_lock::TlsProvider::Ring).await
            })*
        }
        #[cfg(feature = "tls-graviola")]
        mod graviola {
            $(#[tokio::test]
            async fn $test() {
                super::$test(kafka_lock::TlsProvider::Graviola).await
            })*
        }
    };
}

per_provider!(
    sasl_ssl_plain,
    sasl_ssl_scram_sha_256,
    sasl_ssl_scram_sha_512,
    ssl_with_client_certificate,
    ssl_without_client_certificate,
    tls_client_on_a_plaintext_listener,
    unknown_ca,
    hostname_mismatch,
    wrong_password,
    group_not_authorized,
);

fn tls(provider: TlsProvider) -> Tls {
    Tls::new()
        .ca_file(&secure_kafka().certs().ca)
        .crypto_provider(provider)
}

fn sasl_ssl(
    provider: TlsProvider,
    mechanism: SaslMechanism,
    (user, password): (&str, &str),
) -> Security {
    Security::new(SecurityProtocol::SaslSsl)
        .with_tls(tls(provider))
        .with_sasl(Sasl::new(mechanism, user, Secret::new(password)))
}

fn opts(listener: &str, security: Security, prefix: &str) -> LockOptions {
    LockOptions::new(secure_kafka().addr(listener), unique_group(prefix))
        .security(security)
        .session_timeout(Duration::from_secs(6))
        .rebalance_timeout(Duration::from_secs(6))
        .heartbeat_interval(Duration::from_millis(500))
        .lease_margin(Duration::from_secs(1))
        .connect_timeout(Duration::from_secs(10))
}

/// Takes the lock, hands it over to a second contender on release, and checks the tokens.
async fn acquire_and_hand_over(options: LockOptions) {
    let first = options
        .acquire(Some(SECURE_WAIT))
        .await
        .unwrap_or_else(|e| panic!("acquire: {e}\n{}", secure_kafka().log_tail()));
    let token = first.token();
    let second = tokio::spawn({
        let options = options.clone();
        async move { options.acquire(Some(SECURE_WAIT)).await }
    });
    // The second contender joins while the first holds; releasing hands the lock over.
    tokio::time::sleep(Duration::from_millis(300)).await;
    first.release().await.expect("release");
    let second = second.await.unwrap().expect("second acquire");
    assert!(
        second.token() > token,
        "{:?} then {:?}",
        token,
        second.token()
    );
    second.release().await.expect("release");
}

async fn sasl_ssl_plain(p: TlsProvider) {
    acquire_and_hand_over(opts(
        "SASL_SSL",
        sasl_ssl(p, SaslMechanism::Plain, PLAIN_USER),
        "sec-plain",
    ))
    .await;
}

async fn sasl_ssl_scram_sha_256(p: TlsProvider) {
    acquire_and_hand_over(opts(
        "SASL_SSL",
        sasl_ssl(p, SaslMechanism::ScramSha256, SCRAM256_USER),
        "sec-scram256",
    ))
    .await;
}

async fn sasl_ssl_scram_sha_512(p: TlsProvider) {
    acquire_and_hand_over(opts(
        "SASL_SSL",
        sasl_ssl(p, SaslMechanism::ScramSha512, SCRAM512_USER),
        "sec-scram512",
    ))
    .await;
}

#[tokio::test]
async fn sasl_plaintext_scram() {
    let security = Security::new(SecurityProtocol::SaslPlaintext).with_sasl(Sasl::scram_sha512(
        SCRAM512_USER.0,
        Secret::new(SCRAM512_USER.1),
    ));
    acquire_and_hand_over(opts("SASL_PLAINTEXT", security, "sec-saslplain")).await;
}

/// The SSL listener requires a client certificate; the principal is the certificate's DN.
async fn ssl_with_client_certificate(p: TlsProvider) {
    let certs = secure_kafka().certs();
    let security = Security::new(SecurityProtocol::Ssl)
        .with_tls(tls(p).client_cert_files(&certs.client_cert, &certs.client_key));
    acquire_and_hand_over(opts("SSL", security, "sec-mtls")).await;
    assert!(!CLIENT_CN.is_empty());
}

/// Without a client certificate the SSL listener refuses the session; the error says to set one.
async fn ssl_without_client_certificate(p: TlsProvider) {
    let security = Security::new(SecurityProtocol::Ssl).with_tls(tls(p));
    let err = acquire_error(opts("SSL", security, "sec-err-nocert")).await;
    assert!(
        matches!(security_error(&err), SecurityError::Tls { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("ssl.certificate.location"),
        "{err}"
    );
}

fn default_provider() -> TlsProvider {
    TlsProvider::build_default().expect("the integration tests are built with TLS")
}

/// What an acquire fails with, within a bound that no retry loop may exceed.
async fn acquire_error(options: LockOptions) -> Error {
    let started = Instant::now();
    let result = options.acquire(Some(SECURE_WAIT)).await;
    let err = match result {
        Ok(_) => panic!("acquired with settings that should fail"),
        Err(e) => e,
    };
    // Misconfiguration is reported at once, not after the bootstrap deadline.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "took {:?}: {err}",
        started.elapsed()
    );
    // One line each.
    assert!(!err.to_string().contains('\n'), "{err}");
    err
}

fn security_error(err: &Error) -> &SecurityError {
    match err {
        Error::Security(e) => e,
        other => panic!("expected a security error, got {other:?}: {other}"),
    }
}

#[tokio::test]
async fn plaintext_client_on_a_tls_listener() {
    let err = acquire_error(opts("SSL", Security::plaintext(), "sec-err-tlslistener")).await;
    assert!(
        matches!(security_error(&err), SecurityError::TlsListener { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string()
            .contains("security.protocol=SSL or SASL_SSL"),
        "{err}"
    );
    assert_eq!(err.auth_failure(), None);
}

async fn tls_client_on_a_plaintext_listener(p: TlsProvider) {
    let security = Security::new(SecurityProtocol::Ssl).with_tls(tls(p));
    let err = acquire_error(opts("PLAINTEXT", security, "sec-err-plainlistener")).await;
    assert!(
        matches!(
            security_error(&err),
            SecurityError::PlaintextListener { .. }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("plaintext listener"), "{err}");
}

async fn unknown_ca(p: TlsProvider) {
    let security = Security::new(SecurityProtocol::SaslSsl)
        .with_tls(
            Tls::new()
                .ca_file(&secure_kafka().certs().other_ca)
                .crypto_provider(p),
        )
        .with_sasl(Sasl::plain(PLAIN_USER.0, Secret::new(PLAIN_USER.1)));
    let err = acquire_error(opts("SASL_SSL", security, "sec-err-ca")).await;
    assert!(
        matches!(security_error(&err), SecurityError::UnknownCa { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("ssl.ca.location"), "{err}");
}

/// The server certificate names only 127.0.0.1; `localhost` is not it. With hostname
/// verification off the same connection works.
async fn hostname_mismatch(p: TlsProvider) {
    let port = secure_kafka()
        .addr("SSL")
        .rsplit_once(':')
        .unwrap()
        .1
        .to_owned();
    let certs = secure_kafka().certs();
    let mtls = tls(p).client_cert_files(&certs.client_cert, &certs.client_key);
    let by_name = |tls: Tls| {
        opts(
            "SSL",
            Security::new(SecurityProtocol::Ssl).with_tls(tls),
            "sec-err-host",
        )
    };
    let mut options = by_name(mtls.clone());
    options = LockOptions::new(format!("localhost:{port}"), options.name().to_owned())
        .security(options.security_settings().clone());
    let err = acquire_error(options).await;
    assert!(
        matches!(security_error(&err), SecurityError::HostnameMismatch { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("not valid for localhost"), "{err}");

    // Only the bootstrap connection uses the name; the advertised address is 127.0.0.1.
    let insecure = mtls.dangerous_disable_hostname_verification();
    let options = by_name(insecure.clone());
    let options = LockOptions::new(format!("localhost:{port}"), options.name().to_owned())
        .security(Security::new(SecurityProtocol::Ssl).with_tls(insecure));
    let guard = options.acquire(Some(SECURE_WAIT)).await.expect("acquire");
    guard.release().await.unwrap();
}

async fn wrong_password(p: TlsProvider) {
    for mechanism in [SaslMechanism::Plain, SaslMechanism::ScramSha512] {
        let user = match mechanism {
            SaslMechanism::Plain => PLAIN_USER.0,
            _ => SCRAM512_USER.0,
        };
        let security = sasl_ssl(p, mechanism, (user, "not-the-password"));
        let err = acquire_error(opts("SASL_SSL", security, "sec-err-pw")).await;
        assert!(
            matches!(
                security_error(&err),
                SecurityError::AuthenticationFailed { .. }
            ),
            "{mechanism}: {err:?}"
        );
        assert_eq!(err.auth_failure(), Some(AuthFailure::Authentication));
        assert!(err.to_string().contains("sasl.password"), "{err}");
    }
}

/// The SASL_PLAINTEXT listener enables SCRAM only; the error lists what it enables.
#[tokio::test]
async fn mechanism_not_enabled() {
    let security = Security::new(SecurityProtocol::SaslPlaintext)
        .with_sasl(Sasl::plain(PLAIN_USER.0, Secret::new(PLAIN_USER.1)));
    let err = acquire_error(opts("SASL_PLAINTEXT", security, "sec-err-mech")).await;
    match security_error(&err) {
        SecurityError::MechanismNotEnabled {
            mechanism, enabled, ..
        } => {
            assert_eq!(mechanism, "PLAIN");
            let mut enabled = enabled.clone();
            enabled.sort();
            assert_eq!(enabled, ["SCRAM-SHA-256", "SCRAM-SHA-512"]);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(err.auth_failure(), Some(AuthFailure::Authentication));
    assert!(err.to_string().contains("SCRAM-SHA-256"), "{err}");
}

async fn group_not_authorized(p: TlsProvider) {
    let options = opts(
        "SASL_SSL",
        sasl_ssl(p, SaslMechanism::ScramSha512, NOBODY),
        "sec-err-acl",
    );
    let err = acquire_error(options.clone()).await;
    match security_error(&err) {
        SecurityError::GroupAuthorizationFailed { group } => assert_eq!(group, options.name()),
        other => panic!("{other:?}"),
    }
    assert_eq!(err.auth_failure(), Some(AuthFailure::Authorization));
}

/// KIP-368: on a listener with `connections.max.reauth.ms` = 4 s, a holder keeps the lock across
/// several session deadlines, and a connection keeps answering across them.
#[tokio::test]
async fn long_hold_survives_reauthentication() {
    crate::support::init_tracing();
    let security = Security::new(SecurityProtocol::SaslPlaintext).with_sasl(Sasl::scram_sha512(
        SCRAM512_USER.0,
        Secret::new(SCRAM512_USER.1),
    ));
    let options = opts("REAUTH", security.clone(), "sec-reauth");
    let guard = options.acquire(Some(SECURE_WAIT)).await.expect("acquire");

    // A bare connection next to it, used the whole time.
    let cfg = ConnConfig::default().with_security(security);
    let conn = Connection::connect(&secure_kafka().addr("REAUTH"), &cfg)
        .await
        .expect("connect");
    let hold = Duration::from_millis(REAUTH_MS * 3 + 1000);
    let until = Instant::now() + hold;
    while Instant::now() < until {
        conn.request(MetadataRequest::default())
            .await
            .unwrap_or_else(|e| panic!("a request after re-authentication failed: {e}"));
        assert!(guard.is_held(), "the hold ended during re-authentication");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(!conn.is_closed());
    assert!(guard.is_held());
    guard.release().await.expect("release");
    let stats = options.stats();
    assert!(stats.losses.iter().all(|(_, n)| *n == 0), "{stats:?}");
}

/// KIP-368 with many locks over one `Client`: every connection they share re-authenticates on
/// its own schedule, and none of the locks loses its hold across several session deadlines.
#[tokio::test]
async fn many_locks_of_one_client_survive_reauthentication() {
    crate::support::init_tracing();
    let security = Security::new(SecurityProtocol::SaslPlaintext).with_sasl(Sasl::scram_sha512(
        SCRAM512_USER.0,
        Secret::new(SCRAM512_USER.1),
    ));
    let client = kafka_lock::Client::new(secure_kafka().addr("REAUTH"))
        .security(security)
        .connect_timeout(Duration::from_secs(10));
    let prefix = unique_group("sec-reauth-many");
    let mut held = Vec::new();
    for i in 0..6 {
        let options = client
            .lock(format!("{prefix}-{i}"))
            .session_timeout(Duration::from_secs(6))
            .rebalance_timeout(Duration::from_secs(6))
            .heartbeat_interval(Duration::from_millis(500))
            .lease_margin(Duration::from_secs(1));
        let guard = options.acquire(Some(SECURE_WAIT)).await.expect("acquire");
        held.push((options, guard));
    }
    let until = Instant::now() + Duration::from_millis(REAUTH_MS * 3 + 1000);
    while Instant::now() < until {
        for (options, guard) in &held {
            assert!(
                guard.is_held(),
                "{} ended during re-authentication",
                options.name()
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    for (options, guard) in held {
        assert!(guard.is_held());
        guard.release().await.expect("release");
        let stats = options.stats();
        assert!(stats.losses.iter().all(|(_, n)| *n == 0), "{stats:?}");
    }
}

/// The same kind of connection without renewal (`from_stream` has no address to redial) is
/// closed by the broker once the session lifetime has passed: the renewal above is what keeps
/// connections alive, and this test shows the broker really enforces the deadline.
#[tokio::test]
async fn without_renewal_the_broker_closes_the_connection() {
    let addr = secure_kafka().addr("REAUTH");
    let cfg = ConnConfig::default().with_security(
        Security::new(SecurityProtocol::SaslPlaintext).with_sasl(Sasl::scram_sha512(
            SCRAM512_USER.0,
            Secret::new(SCRAM512_USER.1),
        )),
    );
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let conn = Connection::from_stream(tcp, &addr, &cfg)
        .await
        .expect("set up");
    let until = Instant::now() + Duration::from_millis(REAUTH_MS * 3);
    let mut failed = None;
    while Instant::now() < until {
        if let Err(e) = conn.request(MetadataRequest::default()).await {
            failed = Some(e);
            break;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let e = failed.expect("the broker kept an expired SASL session open");
    assert!(e.is_retriable(), "{e}");
}

/// Nothing secret in TRACE logs, errors or `Debug`.
#[test]
fn secrets_stay_out_of_logs_errors_and_debug() {
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);
    impl Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    // Callsites other tests' threads hit first may have cached "no subscriber is interested";
    // recompute with this thread's subscriber registered.
    tracing::callsite::rebuild_interest_cache();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut shown = String::new();
    rt.block_on(async {
        let good = opts(
            "SASL_SSL",
            sasl_ssl(
                default_provider(),
                SaslMechanism::ScramSha512,
                SCRAM512_USER,
            ),
            "sec-secrets",
        );
        let guard = good.acquire(Some(SECURE_WAIT)).await.expect("acquire");
        shown += &format!("{good:?} {guard:?}");
        guard.release().await.unwrap();
        let bad = opts(
            "SASL_SSL",
            sasl_ssl(
                default_provider(),
                SaslMechanism::Plain,
                (PLAIN_USER.0, "wrong-secret-Hq8v"),
            ),
            "sec-secrets",
        );
        let err = bad.acquire(Some(SECURE_WAIT)).await.unwrap_err();
        shown += &format!("{bad:?} {err:?} {err}");
    });
    let logs = String::from_utf8(captured.0.lock().unwrap().clone()).unwrap();
    assert!(
        logs.contains("SASL authenticated"),
        "no TRACE logs captured: {} bytes: {}",
        logs.len(),
        logs.chars().take(2000).collect::<String>()
    );
    for secret in [SCRAM512_USER.1, "wrong-secret-Hq8v", PLAIN_USER.1] {
        assert!(!logs.contains(secret), "{secret} in the logs");
        assert!(
            !shown.contains(secret),
            "{secret} in Debug or errors: {shown}"
        );
    }
    // SCRAM's client-final-message carries the proof as p=<base64>; it is never logged.
    assert!(!logs.contains(",p="), "a SCRAM proof in the logs");
}

/// Acquire time (connect, join, sync, and release) over SASL_SSL with SCRAM-SHA-512 against
/// PLAINTEXT on the same broker, alternating, fresh group each time. Prints the distribution;
/// asserts nothing about speed. BENCHMARKS.md has the command and a run.
#[tokio::test]
#[ignore = "benchmark: run by hand, see BENCHMARKS.md"]
async fn bench_acquire_sasl_ssl_vs_plaintext() {
    const REPS: usize = 30;
    let secured = sasl_ssl(
        default_provider(),
        SaslMechanism::ScramSha512,
        SCRAM512_USER,
    );
    let mut times: [(&str, Vec<Duration>); 2] = [("PLAINTEXT", vec![]), ("SASL_SSL", vec![])];
    // Warm both paths (JIT of the broker, first PBKDF2 on its side).
    for rep in 0..REPS + 2 {
        for (listener, samples) in times.iter_mut() {
            let security = if *listener == "PLAINTEXT" {
                Security::plaintext()
            } else {
                secured.clone()
            };
            let options = opts(listener, security, "sec-bench");
            let started = Instant::now();
            let guard = options.acquire(Some(SECURE_WAIT)).await.expect("acquire");
            let acquired = started.elapsed();
            guard.release().await.expect("release");
            if rep >= 2 {
                samples.push(acquired);
            }
        }
    }
    for (listener, samples) in &mut times {
        samples.sort();
        let pct = |p: usize| samples[(samples.len() - 1) * p / 100];
        println!(
            "{listener:<10} n={} min={:?} p50={:?} p90={:?} max={:?}",
            samples.len(),
            samples[0],
            pct(50),
            pct(90),
            samples[samples.len() - 1]
        );
    }
}

/// The crypto providers side by side on the secured node, alternating, 2 warm-up rounds then
/// `REPS` of each, printing the distributions (asserts nothing about speed; BENCHMARKS.md has
/// the command and a run):
///
/// - a full TLS handshake: `Connection::connect` to the SSL listener (TCP, a TLS 1.3 handshake
///   with no session to resume, as every connection makes one, with the client certificate, and
///   ApiVersions), next to the same connect on PLAINTEXT;
/// - with `KAFKA_LOCK_BENCH_CLI=ring=PATH,graviola=PATH` (release builds of the CLI, e.g. the
///   static binaries), `PATH run … -- true` over SASL_SSL with SCRAM-SHA-512: the whole process,
///   whose time is the acquire (two connections) and the release.
#[tokio::test]
#[ignore = "benchmark: run by hand, see BENCHMARKS.md"]
async fn bench_tls_providers() {
    const REPS: usize = 30;
    let certs = secure_kafka().certs();
    let mut rows: Vec<(String, Vec<Duration>)> = vec![("PLAINTEXT connect".into(), vec![])];
    let mut configs = vec![ConnConfig::default()];
    for &p in TlsProvider::compiled() {
        rows.push((format!("SSL connect, {p}"), vec![]));
        configs.push(
            ConnConfig::default().with_security(
                Security::new(SecurityProtocol::Ssl)
                    .with_tls(tls(p).client_cert_files(&certs.client_cert, &certs.client_key)),
            ),
        );
    }
    for rep in 0..REPS + 2 {
        for ((_, samples), cfg) in rows.iter_mut().zip(&configs) {
            let listener = if cfg.security.protocol.uses_tls() {
                "SSL"
            } else {
                "PLAINTEXT"
            };
            let started = Instant::now();
            let conn = Connection::connect(&secure_kafka().addr(listener), cfg)
                .await
                .expect("connect");
            let took = started.elapsed();
            drop(conn);
            if rep >= 2 {
                samples.push(took);
            }
        }
    }
    if let Ok(spec) = std::env::var("KAFKA_LOCK_BENCH_CLI") {
        let bins: Vec<(String, String)> = spec
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let mut cli_rows: Vec<(String, Vec<Duration>)> = bins
            .iter()
            .map(|(name, _)| (format!("CLI run over SASL_SSL, {name}"), vec![]))
            .collect();
        for rep in 0..REPS + 2 {
            for ((_, path), (_, samples)) in bins.iter().zip(cli_rows.iter_mut()) {
                let took = time_cli_run(path, &unique_group("sec-bench-cli")).await;
                if rep >= 2 {
                    samples.push(took);
                }
            }
        }
        rows.extend(cli_rows);
    }
    for (what, samples) in &mut rows {
        samples.sort();
        let pct = |p: usize| samples[(samples.len() - 1) * p / 100];
        println!(
            "{what:<34} n={} min={:?} p50={:?} p90={:?} max={:?}",
            samples.len(),
            samples[0],
            pct(50),
            pct(90),
            samples[samples.len() - 1]
        );
    }
}

/// The wall time of one `kafka-lock run -- true` over SASL_SSL (SCRAM-SHA-512); the process is
/// killed if it runs past a bound.
async fn time_cli_run(bin: &str, lock: &str) -> Duration {
    let k = secure_kafka();
    let started = Instant::now();
    let child = tokio::process::Command::new(bin)
        .args(["run", "--bootstrap", &k.addr("SASL_SSL"), "--lock", lock])
        .args([
            "--session-timeout",
            "6s",
            "-X",
            "security.protocol=SASL_SSL",
        ])
        .args(["-X", "sasl.mechanism=SCRAM-SHA-512"])
        .arg("-X")
        .arg(format!("sasl.username={}", SCRAM512_USER.0))
        .arg("-X")
        .arg(format!("ssl.ca.location={}", k.certs().ca.display()))
        .args(["--", "true"])
        .env("KAFKA_LOCK_X_SASL_PASSWORD", SCRAM512_USER.1)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {bin}: {e}"));
    let out = tokio::time::timeout(SECURE_WAIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{bin} run did not finish within {SECURE_WAIT:?}"))
        .expect("wait");
    let took = started.elapsed();
    assert!(
        out.status.success(),
        "{bin}: {}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    took
}

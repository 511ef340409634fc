//! The CLI with OAUTHBEARER settings (`-X`, the client secret from the environment) against
//! the OAuth node: 0 with a good token, 77 when the broker refuses the token, 69 when the token
//! endpoint cannot be reached.

use super::{lock_name, run_to_end_env, STEP};
use crate::support::kafka::oauth::{oauth_kafka, CLIENT_SECRET, EXPIRED, GOOD};

fn run(client: &str, endpoint: &str) -> (i32, Vec<String>, String) {
    let k = oauth_kafka();
    let lock = lock_name("oauth-cli");
    let ca = format!("https.ca.location={}", k.idp().ca.display());
    let url = format!("sasl.oauthbearer.token.endpoint.url={endpoint}");
    let id = format!("sasl.oauthbearer.client.credentials.client.id={client}");
    run_to_end_env(
        &[
            "run",
            "--bootstrap",
            &k.addr(),
            "--lock",
            &lock,
            "--wait",
            "60s",
            "-X",
            "security.protocol=SASL_PLAINTEXT",
            "-X",
            "sasl.mechanism=OAUTHBEARER",
            "-X",
            &url,
            "-X",
            &ca,
            "-X",
            &id,
            "--",
            "sh",
            "-c",
            "echo held $KAFKA_LOCK_TOKEN",
        ],
        &[(
            "KAFKA_LOCK_X_SASL_OAUTHBEARER_CLIENT_CREDENTIALS_CLIENT_SECRET",
            CLIENT_SECRET,
        )],
        STEP,
    )
}

#[test]
fn oauthbearer_good_expired_and_endpoint_down() {
    let k = oauth_kafka();
    let (code, stderr, stdout) = run(GOOD, &k.idp().url);
    assert_eq!(code, 0, "{stderr:?}\n{}", k.log_tail());
    assert!(stdout.starts_with("held "), "{stdout}");

    let (code, stderr, _) = run(EXPIRED, &k.idp().url);
    assert_eq!(code, 77, "{stderr:?}");
    assert!(
        stderr.iter().any(|l| l.contains("OAUTHBEARER")),
        "{stderr:?}"
    );

    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (code, stderr, _) = run(GOOD, &format!("https://127.0.0.1:{port}/token"));
    assert_eq!(code, 69, "{stderr:?}");
    assert!(
        stderr.iter().any(|l| l.contains("token endpoint")),
        "{stderr:?}"
    );
    assert!(
        !stderr.iter().any(|l| l.contains(CLIENT_SECRET)),
        "{stderr:?}"
    );
}
